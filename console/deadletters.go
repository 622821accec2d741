package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
)

type consoleDeadLetters struct {
	Filter url.Values // the filter as given (sink, source, kind, since, document_key, document_key_bson)
	// Selection is the listing's filter as the JSON body of the bulk
	// actions (consoleActionBody): since made absolute and until set to
	// when the listing was read, so "Purge matching" and "Replay matching"
	// act on exactly the entries the filter matched then, never on more.
	// PurgeCount and ReplayCount are how many those are (ReplayCount: the
	// failed ones; Replayable is false for a kind replay refuses).
	Selection   string
	PurgeCount  int64
	ReplayCount int64
	Replayable  bool
	Sinks       []string
	Sources     []string
	Entries     []consoleEntrySummary
	// Next is the URL of the next page, empty on the last. It is built
	// with url.Values.Encode, so the template may use it as is.
	Next    template.URL
	Partial string // the listing failed half way: why
}

type consoleEntrySummary struct {
	ID, Kind, Source, Sink, Operation, DocumentKey, Reason, LastError string
	Attempts                                                          int
	CreatedAt                                                         time.Time
}

type consoleEntry struct {
	consoleEntrySummary
	Namespace, EventID, FirstError string
	Rules                          []string
	ChangeDropped                  bool
	FirstFailedAt, LastFailedAt    time.Time
	// JSON is the whole entry (envelope and change included), indented;
	// Cut is set when it was cut at consoleShownBytes (then compact), Size
	// is its whole length in bytes.
	JSON string
	Cut  bool
	Size int
}

func summaryOf(e deadletter.Entry) consoleEntrySummary {
	return consoleEntrySummary{
		ID: e.ID, Kind: string(e.Kind), Source: e.Source, Sink: e.Sink, Operation: e.Operation,
		DocumentKey: consoleJSON(e.DocumentKey), Reason: e.Reason, LastError: e.LastError,
		Attempts: e.Attempts, CreatedAt: e.CreatedAt,
	}
}

// configNames returns the names of cfg's sinks and sources, for the
// filter forms.
func configNames(cfg *config.Config) (sinks, sources []string) {
	for _, s := range cfg.Sinks {
		sinks = append(sinks, s.Name)
	}
	for _, s := range cfg.Sources {
		sources = append(sources, s.Name)
	}
	return sinks, sources
}

func (c *Console) consoleDeadLetters(r *http.Request, p *consolePage) int {
	cfg := c.gw.Config()
	d := &consoleDeadLetters{Filter: url.Values{}}
	d.Sinks, d.Sources = configNames(cfg)
	p.DeadLetters = d
	q := api.DeadLetterQueryOf(r)
	for k, v := range map[string]string{"sink": q.Sink, "source": q.Source, "kind": q.Kind, "since": q.Since,
		"document_key": q.DocumentKey, "document_key_bson": q.DocumentKeyBSON} {
		if v != "" {
			d.Filter.Set(k, v)
		}
	}
	if q.Limit == "" {
		q.Limit = strconv.Itoa(consoleListLimit)
	}
	now := time.Now()
	f, err := q.ListFilter(now)
	if err != nil {
		p.Error = err.Error()
		return http.StatusBadRequest
	}
	if err := c.selection(r, d, q, f, now); err != nil {
		p.Error = err.Error()
		return http.StatusInternalServerError
	}
	started := false
	err = c.dls.Summaries(r.Context(), f, func() { started = true }, func(e deadletter.Entry) error {
		d.Entries = append(d.Entries, summaryOf(e))
		return nil
	})
	if err != nil {
		if !started {
			p.Error = err.Error()
			if errors.Is(err, deadletter.ErrNotFound) {
				return http.StatusNotFound // the after entry is gone
			}
			return http.StatusInternalServerError
		}
		d.Partial = err.Error()
	}
	if err == nil && len(d.Entries) == f.Limit {
		next := url.Values{}
		for k, v := range d.Filter {
			next[k] = v
		}
		next.Set("after", d.Entries[len(d.Entries)-1].ID)
		if q.Limit != strconv.Itoa(consoleListLimit) {
			next.Set("limit", q.Limit)
		}
		d.Next = template.URL("/ui/deadletters?" + next.Encode())
	}
	return http.StatusOK
}

// selection fills d's bulk-action selection from the listing's query q
// (filter f, read at now) and counts what it selects.
func (c *Console) selection(r *http.Request, d *consoleDeadLetters, q api.DeadLetterQuery, f deadletter.Filter, now time.Time) error {
	// Entries are created with millisecond times: until is just after
	// now's millisecond, so every entry the listing could see is in.
	until := now.Truncate(time.Millisecond).Add(time.Millisecond)
	body := consoleActionBody{Sink: q.Sink, Source: q.Source, Kind: q.Kind, DocumentKey: q.DocumentKey,
		DocumentKeyBSON: q.DocumentKeyBSON, Until: until.UTC().Format(time.RFC3339Nano)}
	if !f.Since.IsZero() {
		body.Since = f.Since.UTC().Format(time.RFC3339Nano)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	d.Selection = string(b)
	all := f
	all.Limit, all.AfterID, all.Until = 0, "", until
	if d.PurgeCount, err = c.dls.Count(r.Context(), all); err != nil {
		return err
	}
	switch all.Kind {
	case "", deadletter.KindFailed:
		d.Replayable = true
		all.Kind = deadletter.KindFailed
		d.ReplayCount, err = c.dls.Count(r.Context(), all)
	}
	return err
}

func (c *Console) consoleEntry(r *http.Request, p *consolePage) int {
	id := r.PathValue("id")
	// The whole entry is read (up to a few times 16 MiB): at most
	// api.MaxPayloads at once, with the API's reads; what the page keeps of it
	// is cut at consoleShownBytes.
	if !c.api.Payloads().Enter(r.Context()) {
		p.Error = "the request ended while waiting for a turn to read the entry"
		return http.StatusServiceUnavailable
	}
	defer c.api.Payloads().Leave()
	e, ok, err := c.dls.Get(r.Context(), id)
	if err != nil {
		p.Error = err.Error()
		return http.StatusInternalServerError
	}
	if !ok {
		p.Error = fmt.Sprintf("no dead letter %q (replayed or purged?)", id)
		return http.StatusNotFound
	}
	p.Entry = entryView(e)
	return http.StatusOK
}

func entryView(e deadletter.Entry) *consoleEntry {
	v := &consoleEntry{
		consoleEntrySummary: summaryOf(e), Namespace: e.Namespace, EventID: e.EventID, FirstError: e.FirstError,
		Rules: e.Rules, ChangeDropped: e.ChangeDropped, FirstFailedAt: e.FirstFailedAt, LastFailedAt: e.LastFailedAt,
	}
	if b, err := e.MarshalJSON(); err == nil {
		v.Size = len(b)
		if len(b) > consoleShownBytes {
			// Too large to show whole: the start of it, compact (no
			// indented copy of the whole).
			b, v.Cut = b[:consoleShownBytes], true
		} else {
			var ind bytes.Buffer
			if json.Indent(&ind, b, "", "  ") == nil {
				b = ind.Bytes()
			}
			if len(b) > consoleShownBytes {
				b, v.Cut = b[:consoleShownBytes], true
			}
		}
		v.JSON = strings.ToValidUTF8(string(b), "\uFFFD")
	} else {
		v.JSON = "(cannot render: " + err.Error() + ")"
	}
	return v
}

// consoleActionBody is the JSON body of the console's actions: a
// dead-letter selection (ids, or a filter as on the dead-letter page).
type consoleActionBody struct {
	IDs             []string `json:"ids,omitempty"`
	Sink            string   `json:"sink,omitempty"`
	Source          string   `json:"source,omitempty"`
	Kind            string   `json:"kind,omitempty"`
	Since           string   `json:"since,omitempty"`
	DocumentKey     string   `json:"document_key,omitempty"`
	DocumentKeyBSON string   `json:"document_key_bson,omitempty"`
	// Until (RFC 3339) selects entries created before it: the time the
	// listing the action comes from was read.
	Until string `json:"until,omitempty"`
	// All must be true to purge with an empty selection (until aside).
	All bool `json:"all,omitempty"`
}

// consoleMaxIDs bounds the ids of one action.
const consoleMaxIDs = 1000

// consoleAction takes an action's body: Content-Type: application/json
// and JSON (its route needs the admin token, as /api/v1's mutating calls).
func (c *Console) consoleAction(h func(http.ResponseWriter, *http.Request, []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			api.WriteError(w, http.StatusUnsupportedMediaType, "console actions take a JSON body: send Content-Type: application/json")
			return
		}
		var body bytes.Buffer
		if _, err := body.ReadFrom(r.Body); err != nil {
			api.WriteError(w, http.StatusBadRequest, "reading the body: "+err.Error())
			return
		}
		if !json.Valid(body.Bytes()) {
			api.WriteError(w, http.StatusBadRequest, "the body is not JSON")
			return
		}
		h(w, r, body.Bytes())
	}
}

// selection decodes an action body into a dead-letter filter.
func selection(b []byte) (deadletter.Filter, bool, error) {
	var body consoleActionBody
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return deadletter.Filter{}, false, fmt.Errorf("body: %w", err)
	}
	q := api.DeadLetterQuery{Sink: body.Sink, Source: body.Source, Kind: body.Kind, Since: body.Since,
		DocumentKey: body.DocumentKey, DocumentKeyBSON: body.DocumentKeyBSON}
	f, err := q.Filter(time.Now(), 0)
	if err != nil {
		return f, false, err
	}
	if body.Until != "" {
		if f.Until, err = time.Parse(time.RFC3339Nano, body.Until); err != nil {
			return f, false, fmt.Errorf("until: %q is not an RFC 3339 time", body.Until)
		}
	}
	if body.IDs != nil {
		if len(body.IDs) == 0 || len(body.IDs) > consoleMaxIDs {
			return f, false, fmt.Errorf("ids: give 1 to %d ids, or none and a filter", consoleMaxIDs)
		}
		f.IDs = slices.Clone(body.IDs)
	}
	everything := body.IDs == nil && f.Sink == "" && f.Source == "" && f.Kind == "" && f.Since.IsZero() &&
		f.DocumentKey == nil && f.ExactDocumentKey == nil
	return f, everything && !body.All, nil
}

func (c *Console) consoleReplay(w http.ResponseWriter, r *http.Request, b []byte) {
	f, _, err := selection(b)
	if err != nil {
		api.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	c.api.ServeReplay(w, r, f)
}

func (c *Console) consolePurge(w http.ResponseWriter, r *http.Request, b []byte) {
	f, refuse, err := selection(b)
	if err != nil {
		api.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	if refuse {
		api.WriteError(w, http.StatusBadRequest, `refusing to purge every dead letter without a filter: send "all": true to mean it`)
		return
	}
	c.api.ServePurge(w, r, f)
}

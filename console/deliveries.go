package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/deliverylog"
)

// consoleMaxSearch bounds what the search box takes, in bytes: an event id
// or a document key is far shorter.
const consoleMaxSearch = 4 << 10

// consoleMaxBatchIDs is how many event ids of one batch record the
// deliveries page links; the rest are counted.
const consoleMaxBatchIDs = 5

// errNoDeliveryLog is the error of a delivery log page when the admin
// server does not serve the delivery log.
var errNoDeliveryLog = errors.New("the delivery log is not served by this process")

// objectIDHex is an ObjectId as the search box takes it bare.
var objectIDHex = regexp.MustCompile(`^[0-9a-fA-F]{24}$`)

// searchTarget returns the page a search for q shows: an event id (its
// source, a colon, its token) its event page, a document key its
// deliveries. A key is a JSON object ({"_id": 42}), or a bare _id: a
// number, a JSON string or an ObjectId's 24 hex digits. Anything else is
// an error that says what the box takes.
func searchTarget(q string) (string, error) {
	q = strings.TrimSpace(q)
	switch {
	case len(q) > consoleMaxSearch:
		return "", fmt.Errorf("the search is %d bytes: event ids and document keys are at most %d", len(q), consoleMaxSearch)
	case q == "":
		return "/ui/deliveries", nil
	case strings.HasPrefix(q, "{"):
		return keyTarget(q), nil
	}
	if _, err := strconv.ParseFloat(q, 64); err == nil && json.Valid([]byte(q)) {
		return keyTarget(`{"_id": ` + q + `}`), nil
	}
	if objectIDHex.MatchString(q) {
		return keyTarget(`{"_id": {"$oid": "` + strings.ToLower(q) + `"}}`), nil
	}
	var s string
	if strings.HasPrefix(q, `"`) && json.Unmarshal([]byte(q), &s) == nil {
		return keyTarget(`{"_id": ` + q + `}`), nil
	}
	if src, rest, ok := strings.Cut(q, ":"); ok && src != "" && rest != "" {
		return "/ui/events/" + url.PathEscape(q), nil
	}
	return "", fmt.Errorf("%q is neither an event id (<source>:<token>, as a delivery record or a dead letter shows it) nor a document key (a JSON object such as {\"_id\": 42}, or a bare _id: 42, \"a-string\" or an ObjectId's 24 hex digits)", q)
}

func keyTarget(key string) string {
	return "/ui/deliveries?" + url.Values{"document_key": {key}}.Encode()
}

// consoleSearch serves GET /ui/search?q=: a redirect to the page of what
// was searched for, or a page saying what the box takes. It shows no data
// itself, so it needs no token (the page it leads to does).
func (c *Console) consoleSearch(w http.ResponseWriter, r *http.Request) {
	target, err := searchTarget(r.URL.Query().Get("q"))
	if err != nil {
		cfg := c.gw.Config()
		renderConsole(w, http.StatusBadRequest, "search", consolePage{Title: consoleTitles["search"], Nav: "search",
			Auth: cfg.Server.ConsoleReadAuth(), Error: err.Error()})
		return
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// keyJSON renders a document key as canonical Extended JSON: what a
// deliveries filter matches literally (relaxed JSON would read an int64
// back as an int32).
func keyJSON(raw bson.Raw) string {
	b, err := bson.MarshalExtJSON(raw, true, false)
	if err != nil {
		return ""
	}
	return string(b)
}

// consoleKey is a document key as the pages show it: relaxed JSON, and
// the URL of its deliveries.
type consoleKey struct {
	Shown string
	Href  template.URL
}

func keyView(raw bson.Raw) consoleKey {
	if len(raw) == 0 {
		return consoleKey{}
	}
	k := consoleKey{Shown: consoleJSON(raw)}
	if canon := keyJSON(raw); canon != "" {
		k.Href = template.URL(keyTarget(canon))
	}
	return k
}

// consoleEvent is the event page: deliverylog.Lifecycle.
type consoleEvent struct {
	deliverylog.Lifecycle
	// Acked is "yes", "no" or "unknown" (Lifecycle.Acknowledged nil).
	Acked string
}

func (c *Console) consoleEvent(r *http.Request, p *consolePage) int {
	dl := c.api.Deliveries()
	if dl == nil {
		p.Error = errNoDeliveryLog.Error()
		return http.StatusNotFound
	}
	id := r.PathValue("id")
	lc, err := dl.Lifecycle(r.Context(), id)
	if err != nil {
		p.Error = err.Error()
		return deliveryCode(err)
	}
	p.Event = eventView(lc)
	return http.StatusOK
}

func eventView(lc deliverylog.Lifecycle) *consoleEvent {
	ev := &consoleEvent{Lifecycle: lc, Acked: "unknown"}
	if lc.Acknowledged != nil {
		ev.Acked = map[bool]string{true: "yes", false: "no"}[*lc.Acknowledged]
	}
	return ev
}

// deliveryCode is the status of a delivery log page that failed with err,
// as the API answers it.
func deliveryCode(err error) int {
	switch {
	case errors.Is(err, deliverylog.ErrBadFilter):
		return http.StatusBadRequest
	case errors.Is(err, deliverylog.ErrNotFound):
		return http.StatusNotFound
	}
	return http.StatusInternalServerError
}

// consoleDeliveries is the deliveries page (the failures view): the
// delivery log's records the filter selects, newest first.
type consoleDeliveries struct {
	Filter   url.Values // the filter as given
	Sinks    []string
	Sources  []string
	Rules    []string
	Statuses []string
	Records  []consoleRecord
	// Next is the URL of the next (older) page, empty on the last; First
	// that of the first page when this is not it.
	Next, First template.URL
}

type consoleRecord struct {
	At                                      time.Time
	EventIDs                                []string // the first consoleMaxBatchIDs
	More                                    int      // the batch's other events
	Source, Sink, Operation, Namespace      string
	Rules                                   string
	Keys                                    []consoleKey
	Attempt                                 int
	Outcome, Code, ErrorClass, Error, Reply string
	Status                                  int
	DurationMS                              float64
	Replica, Redelivery                     string
}

func recordView(r deliverylog.Record) consoleRecord {
	v := consoleRecord{At: r.Time, Source: r.Source, Sink: r.Sink, Operation: r.Operation, Rules: strings.Join(r.Rules, ", "),
		Attempt: r.Attempt, Outcome: string(r.Outcome), Status: r.Status, Code: r.Code, ErrorClass: r.ErrorClass, Error: r.Error,
		Reply: r.Response, DurationMS: float64(r.Duration) / float64(time.Millisecond), Replica: r.Replica, Redelivery: r.Redelivery}
	if r.DB != "" {
		v.Namespace = r.DB + "." + r.Coll
	}
	ids := r.IDs()
	if len(ids) > consoleMaxBatchIDs {
		v.More = len(ids) - consoleMaxBatchIDs
		ids = ids[:consoleMaxBatchIDs]
	}
	v.EventIDs = ids
	keys := r.BatchKeys
	if keys == nil && r.DocumentKey != nil {
		keys = []bson.Raw{r.DocumentKey}
	}
	for i, k := range keys {
		if i == consoleMaxBatchIDs {
			break
		}
		v.Keys = append(v.Keys, keyView(k))
	}
	return v
}

// deliveryFilterKeys are the query parameters of the deliveries page
// (api.DeliveryQueryOf's, after aside), in the form's order.
var deliveryFilterKeys = []string{"sink", "rule", "source", "status", "since", "until", "document_key", "min_attempts", "min_duration", "limit"}

func (c *Console) consoleDeliveries(r *http.Request, p *consolePage) int {
	cfg := c.gw.Config()
	d := &consoleDeliveries{Filter: url.Values{}}
	d.Sinks, d.Sources = configNames(cfg)
	for _, rl := range cfg.Rules {
		d.Rules = append(d.Rules, rl.Name)
	}
	for _, s := range deliverylog.Statuses {
		d.Statuses = append(d.Statuses, string(s))
	}
	p.Deliveries = d
	q := r.URL.Query()
	for _, k := range deliveryFilterKeys {
		if v := q.Get(k); v != "" {
			d.Filter.Set(k, v)
		}
	}
	dl := c.api.Deliveries()
	if dl == nil {
		p.Error = errNoDeliveryLog.Error()
		return http.StatusNotFound
	}
	f, err := api.DeliveryQueryOf(r).Filter(time.Now())
	if err != nil {
		p.Error = err.Error()
		return http.StatusBadRequest
	}
	page, err := dl.List(r.Context(), f)
	if err != nil {
		p.Error = err.Error()
		return deliveryCode(err)
	}
	for _, rec := range page.Records {
		d.Records = append(d.Records, recordView(rec))
	}
	if page.Next != "" {
		next := url.Values{}
		for k, v := range d.Filter {
			next[k] = v
		}
		next.Set("after", page.Next)
		d.Next = template.URL("/ui/deliveries?" + next.Encode())
	}
	if q.Get("after") != "" {
		d.First = template.URL("/ui/deliveries?" + d.Filter.Encode())
	}
	return http.StatusOK
}

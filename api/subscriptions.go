package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/subscription"
)

// Subscriptions is what /api/v1/subscriptions serves: the store, and the
// operator's file (names, sources and [subscriptions] of the configuration
// without the subscriptions merged in).
type Subscriptions struct {
	Store *subscription.Store
	// File returns the operator's configuration in force.
	File func() *config.Config
	// Test routes changes (change events as a source reads them) by the
	// subscription's rule alone and returns what its webhook would be
	// given, for POST /api/v1/subscriptions/test; nil: that route answers
	// 501.
	Test func(route *config.SubscriptionRoute, changes []bson.Raw) ([]SubscriptionTestResult, error)
	// Recent returns up to n of the last changes this process read of a
	// source, oldest first (nil: none are kept).
	Recent func(source string, n int) []bson.Raw
	// Backfill, when set, starts a backfill of the source to the named
	// subscription's sink (created with "backfill": true) once this
	// process applied it; nil: such a creation is refused.
	Backfill func(name string)
}

// SubscriptionTestResult is what a subscription would do with one change.
type SubscriptionTestResult struct {
	// ID is the event id (the webhook-id header), OperationType the
	// change's.
	ID            string `json:"id,omitempty"`
	OperationType string `json:"operation_type,omitempty"`
	// Matches: the subscription's rule routes the change to its webhook.
	Matches bool `json:"matches"`
	// Skipped: it matches, but its shaped update is empty and the webhook
	// does not send it (skip_empty_updates).
	Skipped bool `json:"skipped,omitempty"`
	// Body is the JSON the webhook would post, shaped (one element of the
	// array when it batches), unsigned.
	Body json.RawMessage `json:"body,omitempty"`
	// Error says why the change cannot be tried, or why the subscription
	// would dead-letter it.
	Error string `json:"error,omitempty"`
}

// MaxTestLast bounds "last" of POST /api/v1/subscriptions/test.
const MaxTestLast = 100

// maxActionBody bounds the body of pause, resume and rotate-secret.
const maxActionBody = 4 << 10

// subscriptionRoutes registers /api/v1/subscriptions, served while
// [subscriptions] enabled, to the admin token and the scoped tokens.
func (s *Server) subscriptionRoutes() {
	rs := s.Routes(func() bool { return s.subs.File().Subscriptions.Enabled })
	rs.Handle("POST /api/v1/subscriptions", Scoped, s.createSubscription)
	rs.Handle("POST /api/v1/subscriptions/test", Scoped, s.testSubscription)
	rs.Handle("GET /api/v1/subscriptions", Scoped, s.listSubscriptions)
	rs.Handle("GET /api/v1/subscriptions/{name}", Scoped, s.named(s.showSubscription))
	rs.Handle("PATCH /api/v1/subscriptions/{name}", Scoped, s.named(s.apiManaged(s.patchSubscription)))
	rs.Handle("DELETE /api/v1/subscriptions/{name}", Scoped, s.named(s.apiManaged(s.deleteSubscription)))
	rs.Handle("POST /api/v1/subscriptions/{name}/pause", Scoped, s.named(s.apiManaged(s.statusAction(subscription.StatusPaused))))
	rs.Handle("POST /api/v1/subscriptions/{name}/resume", Scoped, s.named(s.apiManaged(s.statusAction(subscription.StatusActive))))
	rs.Handle("POST /api/v1/subscriptions/{name}/rotate-secret", Scoped, s.named(s.apiManaged(s.rotateSecret)))
}

// Subscriptions returns what /api/v1/subscriptions serves
// (Options.Subscriptions; nil when it is not served), for the console's
// page, which reads and lists it as the API does.
func (s *Server) Subscriptions() *Subscriptions { return s.subs }

// named serves h for a subscription the principal manages, 403 otherwise.
func (s *Server) named(h func(http.ResponseWriter, *http.Request, Principal, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, name := PrincipalOf(r), r.PathValue("name")
		if !p.Manages(name) {
			WriteError(w, http.StatusForbidden, fmt.Sprintf("token %s manages only subscriptions whose names start with %q", p.Name, p.Prefix))
			return
		}
		h(w, r, p, name)
	}
}

// validator checks bodies against the operator's file.
func (s *Server) validator() *subscription.Validator {
	return &subscription.Validator{Config: s.subs.File(), Resolve: subscription.DefaultResolve}
}

// readBody reads a body of at most n bytes; false after answering 400 or
// 413.
func readBody(w http.ResponseWriter, r *http.Request, n int64) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, n))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", n))
		return nil, false
	}
	if err != nil {
		WriteError(w, http.StatusBadRequest, "cannot read the body: "+err.Error())
		return nil, false
	}
	return body, true
}

// writeProblems answers 400 with each problem as "<JSONPath>: <message>".
func writeProblems(w http.ResponseWriter, problems []subscription.Problem) {
	e := Error{Error: "invalid subscription"}
	for _, p := range problems {
		e.Problems = append(e.Problems, p.String())
	}
	WriteJSON(w, http.StatusBadRequest, e)
}

// writeStoreError answers a store error with its status.
func writeStoreError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, subscription.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, subscription.ErrExists), errors.Is(err, subscription.ErrConflict), errors.Is(err, subscription.ErrLimit):
		code = http.StatusConflict
	case errors.Is(err, subscription.ErrNoKey):
		code = http.StatusServiceUnavailable
	case errors.Is(err, subscription.ErrBadCursor):
		code = http.StatusBadRequest
	}
	WriteError(w, code, err.Error())
}

// withSecret renders sub with "managed_by": "api", plus "secret" when
// secret is set: the only answers that carry it (creation, rotation).
func withSecret(sub subscription.Subscription, secret config.Secret) (map[string]json.RawMessage, error) {
	b, err := json.Marshal(sub)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["managed_by"], _ = json.Marshal(ManagedByAPI)
	if secret != "" {
		m["secret"], _ = json.Marshal(secret.Value())
	}
	return m, nil
}

func (s *Server) answer(w http.ResponseWriter, code int, sub subscription.Subscription, secret config.Secret) {
	m, err := withSecret(sub, secret)
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	WriteJSON(w, code, m)
}

// expectedRevision reads If-Match (a revision, quoted or not); 0 without
// one, false after answering 400.
func expectedRevision(w http.ResponseWriter, r *http.Request) (int64, bool) {
	h := strings.Trim(strings.TrimSpace(r.Header.Get("If-Match")), `"`)
	if h == "" || h == "*" {
		return 0, true
	}
	rev, err := strconv.ParseInt(h, 10, 64)
	if err != nil || rev < 1 {
		WriteError(w, http.StatusBadRequest, "If-Match must be a subscription's revision, e.g. \"3\"")
		return 0, false
	}
	return rev, true
}

func (s *Server) createSubscription(w http.ResponseWriter, r *http.Request) {
	p := PrincipalOf(r)
	body, ok := readBody(w, r, config.MaxSubscriptionJSONBytes)
	if !ok {
		return
	}
	route, spec, problems := s.validator().Validate(r.Context(), body)
	if problems != nil {
		writeProblems(w, problems)
		return
	}
	name := route.Rule.Name
	if !p.Manages(name) {
		WriteError(w, http.StatusForbidden, fmt.Sprintf("token %s manages only subscriptions whose names start with %q", p.Name, p.Prefix))
		return
	}
	if route.Backfill {
		switch ops := route.Rule.Operations; {
		case s.subs.Backfill == nil:
			writeProblems(w, []subscription.Problem{{Path: "$.backfill", Message: "backfills of subscriptions are not available here: leave it out"}})
			return
		case len(ops) > 0 && !slices.Contains(ops, "snapshot"):
			writeProblems(w, []subscription.Problem{{Path: "$.backfill", Message: `a backfill sends the existing documents as "snapshot" events: add "snapshot" to operations, or leave backfill out`}})
			return
		}
	}
	sub, secret, err := s.subs.Store.Create(r.Context(), p.Name, name, spec, s.subs.File().Subscriptions.MaxSubscriptions)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	if route.Backfill {
		s.subs.Backfill(name)
	}
	w.Header().Set("Location", "/api/v1/subscriptions/"+name)
	s.answer(w, http.StatusCreated, sub, secret)
}

func (s *Server) listSubscriptions(w http.ResponseWriter, r *http.Request) {
	p := PrincipalOf(r)
	q := r.URL.Query()
	limit := DefaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxListLimit {
			WriteError(w, http.StatusBadRequest, fmt.Sprintf("limit must be a number from 1 to %d", MaxListLimit))
			return
		}
		limit = n
	}
	prefix, cursor := p.ListPrefix(q.Get("prefix")), q.Get("after")
	page, err := s.subs.Store.List(r.Context(), subscription.ListOptions{Prefix: prefix, Cursor: cursor, Limit: limit})
	if err != nil {
		writeStoreError(w, err)
		return
	}
	after, _ := subscription.CursorName(cursor) // List read it
	// The file's names, read-only, in the same name order: those the
	// principal may see, with the prefix, after the cursor.
	file, err := configEntries(s.subs.File(), func(name string) bool {
		return p.Manages(name) && strings.HasPrefix(name, prefix) && name > after
	})
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	out := NewPage(w, "subscriptions", limit)
	out.Begin()
	subs := page.Subscriptions
	for n := 0; n < limit && (len(subs) > 0 || len(file) > 0); n++ {
		var b []byte
		var name string
		if len(file) > 0 && (len(subs) == 0 || file[0].Name <= subs[0].Name) {
			if len(subs) > 0 && subs[0].Name == file[0].Name {
				subs = subs[1:] // stored, but now the file's name: the file's is in force
			}
			name = file[0].Name
			b, err = json.Marshal(file[0])
			file = file[1:]
		} else {
			var m map[string]json.RawMessage
			if m, err = withSecret(subs[0], ""); err == nil {
				b, err = json.Marshal(m)
			}
			name = subs[0].Name
			subs = subs[1:]
		}
		if err != nil {
			out.End(err)
			return
		}
		if err := out.Add(b, subscription.CursorAfter(name)); err != nil {
			return
		}
	}
	out.End(nil)
}

// showSubscription shows a stored subscription, or the configuration
// file's entry of that name (read-only; no ETag: it has no revision).
func (s *Server) showSubscription(w http.ResponseWriter, r *http.Request, _ Principal, name string) {
	if e, ok, err := s.configEntryOf(name); err != nil || ok {
		if err != nil {
			WriteError(w, http.StatusInternalServerError, err.Error())
			return
		}
		WriteJSON(w, http.StatusOK, e)
		return
	}
	sub, err := s.subs.Store.Get(r.Context(), name)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(sub.Revision, 10)))
	s.answer(w, http.StatusOK, sub, "")
}

// patchSubscription applies a JSON merge patch (RFC 7396) to the stored
// JSON form and stores the result once it validates; If-Match makes it
// conditional on a revision.
func (s *Server) patchSubscription(w http.ResponseWriter, r *http.Request, p Principal, name string) {
	expected, ok := expectedRevision(w, r)
	if !ok {
		return
	}
	patch, ok := readBody(w, r, config.MaxSubscriptionJSONBytes)
	if !ok {
		return
	}
	cur, err := s.subs.Store.Get(r.Context(), name)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	if expected > 0 && cur.Revision != expected {
		writeStoreError(w, fmt.Errorf("subscription %s: %w (revision %d, not %d)", name, subscription.ErrConflict, cur.Revision, expected))
		return
	}
	merged, err := mergePatch(cur.Spec, patch)
	if err != nil {
		writeProblems(w, []subscription.Problem{{Path: "$", Message: err.Error()}})
		return
	}
	route, spec, problems := s.validator().Validate(r.Context(), merged)
	if problems == nil && route.Rule.Name != name {
		problems = []subscription.Problem{{Path: "$.name", Message: "a subscription's name cannot change: create another"}}
	}
	if problems == nil && !bytes.Equal(member(cur.Spec, "backfill"), member(merged, "backfill")) {
		problems = []subscription.Problem{{Path: "$.backfill", Message: "a backfill is asked for when a subscription is created; start one with POST /api/v1/backfills"}}
	}
	if problems != nil {
		writeProblems(w, problems)
		return
	}
	sub, err := s.subs.Store.Update(r.Context(), p.Name, name, cur.Revision, spec)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	s.answer(w, http.StatusOK, sub, "")
}

// mergePatch applies patch (RFC 7396) to doc.
func mergePatch(doc, patch []byte) ([]byte, error) {
	var d, p any
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(patch))
	dec.UseNumber()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("the patch is not JSON: %v", err)
	}
	if _, ok := p.(map[string]any); !ok {
		return nil, errors.New("the patch must be a JSON object (RFC 7396 merge patch)")
	}
	return json.Marshal(applyPatch(d, p))
}

func applyPatch(doc, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	dm, ok := doc.(map[string]any)
	if !ok {
		dm = map[string]any{}
	}
	for k, v := range pm {
		if v == nil {
			delete(dm, k)
			continue
		}
		dm[k] = applyPatch(dm[k], v)
	}
	return dm
}

func (s *Server) deleteSubscription(w http.ResponseWriter, r *http.Request, p Principal, name string) {
	expected, ok := expectedRevision(w, r)
	if !ok {
		return
	}
	purge, err := s.subs.Store.Delete(r.Context(), p.Name, name, expected)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	at := purge.PurgeAt.UTC().Format(time.RFC3339)
	WriteJSON(w, http.StatusOK, map[string]string{
		"deleted": name,
		"dead_letters": "its parked and dead-lettered events stay in the dead-letter store until " + at +
			" ([subscriptions] delete_grace), to be read or exported (GET /api/v1/deadletters?sink=" + name +
			"), then they are removed, unless a subscription or a sink of the file takes the name again before",
		"purge_at": at,
	})
}

// actionRequest reads the If-Match revision and the optional body of an
// action into req (strictly; want shows its form in the error); false
// after answering 400 or 413.
func actionRequest(w http.ResponseWriter, r *http.Request, req any, want string) (int64, bool) {
	expected, ok := expectedRevision(w, r)
	if !ok {
		return 0, false
	}
	body, ok := readBody(w, r, maxActionBody)
	if !ok {
		return 0, false
	}
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(req); err != nil {
			writeProblems(w, []subscription.Problem{{Path: "$", Message: "want " + want + " or no body: " + err.Error()}})
			return 0, false
		}
	}
	return expected, true
}

// statusAction pauses or resumes; a pause's body may give {"reason"}.
func (s *Server) statusAction(st subscription.Status) func(http.ResponseWriter, *http.Request, Principal, string) {
	return func(w http.ResponseWriter, r *http.Request, p Principal, name string) {
		var req struct {
			Reason string `json:"reason"`
		}
		expected, ok := actionRequest(w, r, &req, `{"reason": "..."}`)
		if !ok {
			return
		}
		sub, err := s.subs.Store.SetStatus(r.Context(), p.Name, name, expected, st, req.Reason)
		if err != nil {
			writeStoreError(w, err)
			return
		}
		s.answer(w, http.StatusOK, sub, "")
	}
}

func (s *Server) rotateSecret(w http.ResponseWriter, r *http.Request, p Principal, name string) {
	var req struct {
		Overlap string `json:"overlap"`
	}
	expected, ok := actionRequest(w, r, &req, `{"overlap": "24h"}`)
	if !ok {
		return
	}
	overlap := subscription.DefaultOverlap
	if req.Overlap != "" {
		d, err := time.ParseDuration(req.Overlap)
		if err != nil || d < 0 || d > subscription.MaxOverlap {
			writeProblems(w, []subscription.Problem{{Path: "$.overlap", Message: fmt.Sprintf("want a duration from \"0s\" to %q", subscription.MaxOverlap.String())}})
			return
		}
		overlap = d
	}
	sub, secret, err := s.subs.Store.RotateSecret(r.Context(), p.Name, name, expected, overlap)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	s.answer(w, http.StatusOK, sub, secret)
}

// testSubscription answers POST /api/v1/subscriptions/test: a
// subscription's JSON form (checked as a create checks it, with the same
// problems and JSONPaths) plus "change" (one change event, Extended JSON)
// or "last" (1 to MaxTestLast: this process's last changes of its source),
// answered with what it would do with each. Nothing is stored.
func (s *Server) testSubscription(w http.ResponseWriter, r *http.Request) {
	p := PrincipalOf(r)
	if s.subs.Test == nil {
		WriteError(w, http.StatusNotImplemented, "trying subscriptions is not available here")
		return
	}
	body, ok := readBody(w, r, config.MaxSubscriptionJSONBytes)
	if !ok {
		return
	}
	spec, extra, problems := splitMembers(body, "change", "last")
	if problems != nil {
		writeProblems(w, problems)
		return
	}
	change, last := extra["change"], extra["last"]
	switch {
	case change == nil && last == nil:
		problems = append(problems, subscription.Problem{Path: "$", Message: `give "change" (a change event, Extended JSON) or "last" (how many of the source's last changes to try)`})
	case change != nil && last != nil:
		problems = append(problems, subscription.Problem{Path: "$.last", Message: `give "change" or "last", not both`})
	}
	var n int
	if last != nil {
		if err := json.Unmarshal(last, &n); err != nil || n < 1 || n > MaxTestLast {
			problems = append(problems, subscription.Problem{Path: "$.last", Message: fmt.Sprintf("want a whole number from 1 to %d", MaxTestLast)})
		}
	}
	var changes []bson.Raw
	if change != nil {
		var raw bson.Raw
		if err := bson.UnmarshalExtJSON(change, false, &raw); err != nil {
			problems = append(problems, subscription.Problem{Path: "$.change", Message: "want a change event as an object in Extended JSON (as changegate tail prints it): " + err.Error()})
		} else {
			changes = []bson.Raw{raw}
		}
	}
	route, _, vproblems := s.validator().Validate(r.Context(), spec)
	problems = append(vproblems, problems...)
	if len(problems) > 0 {
		writeProblems(w, problems)
		return
	}
	name := route.Rule.Name
	if !p.Manages(name) {
		WriteError(w, http.StatusForbidden, fmt.Sprintf("token %s manages only subscriptions whose names start with %q", p.Name, p.Prefix))
		return
	}
	if last != nil && s.subs.Recent != nil {
		changes = s.subs.Recent(route.Rule.Source, n)
	}
	results, err := s.subs.Test(route, changes)
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	out := map[string]any{
		"subscription": name, "source": route.Rule.Source,
		"batched": route.Sink.BatchSize > 1, "results": results,
	}
	if last != nil && len(changes) < n {
		out["note"] = fmt.Sprintf("%d of the %d changes asked for: this replica keeps the last %d changes of each source it read since it started (only those the source's stream lets through)", len(changes), n, MaxTestLast)
	}
	WriteJSON(w, http.StatusOK, out)
}

// splitMembers removes the top-level members named by names from the JSON
// object body, in their order, and returns the rest as a JSON object (its
// members as written, duplicates kept for the validator to report) and
// the removed members.
func splitMembers(body []byte, names ...string) ([]byte, map[string]json.RawMessage, []subscription.Problem) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return body, nil, nil // the validator says what is wrong
	}
	extra := map[string]json.RawMessage{}
	var rest bytes.Buffer
	rest.WriteByte('{')
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return body, nil, nil
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return body, nil, nil
		}
		if slices.Contains(names, key) {
			if extra[key] != nil {
				return nil, nil, []subscription.Problem{{Path: "$." + key, Message: "duplicate field"}}
			}
			extra[key] = v
			continue
		}
		if rest.Len() > 1 {
			rest.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		rest.Write(k)
		rest.WriteByte(':')
		rest.Write(v)
	}
	rest.WriteByte('}')
	if _, err := dec.Token(); err != nil { // '}'
		return body, nil, nil
	}
	if dec.More() {
		return body, nil, nil
	}
	return rest.Bytes(), extra, nil
}

// member returns the JSON of member name of the object doc, nil when it
// has none (or doc is not an object).
func member(doc []byte, name string) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(doc, &m) != nil {
		return nil
	}
	return bytes.TrimSpace(m[name])
}

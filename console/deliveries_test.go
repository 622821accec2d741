package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deliverylog"
)

// fakeDeliveries is a delivery log that answers fixed values and records
// the filters and windows it was asked for.
type fakeDeliveries struct {
	mu        sync.Mutex
	lifecycle deliverylog.Lifecycle
	page      deliverylog.Page
	analytics deliverylog.Analytics
	filters   []deliverylog.Filter
	windows   []string
	dropped   []int64
}

func (f *fakeDeliveries) List(_ context.Context, fl deliverylog.Filter) (deliverylog.Page, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filters = append(f.filters, fl)
	return f.page, nil
}

func (f *fakeDeliveries) Lifecycle(_ context.Context, id string) (deliverylog.Lifecycle, error) {
	if id != f.lifecycle.EventID {
		return deliverylog.Lifecycle{}, fmt.Errorf("%w: %s", deliverylog.ErrNotFound, id)
	}
	return f.lifecycle, nil
}

func (f *fakeDeliveries) Analytics(_ context.Context, window string, dropped int64) (deliverylog.Analytics, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := deliverylog.Windows[window]; !ok {
		return deliverylog.Analytics{}, fmt.Errorf("%w: window %q", deliverylog.ErrBadFilter, window)
	}
	f.windows = append(f.windows, window)
	f.dropped = append(f.dropped, dropped)
	a := f.analytics
	a.Window = window
	return a, nil
}

// hostileLifecycle is an event whose id, sink, rules, errors and answers
// are hostile text.
func hostileLifecycle() deliverylog.Lifecycle {
	acked := false
	at := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	return deliverylog.Lifecycle{EventID: "items:" + hostile, Source: "items", Acknowledged: &acked, Covers: []string{hostile},
		Sinks: []deliverylog.SinkLifecycle{
			{Sink: hostile, Rules: []string{hostile}, State: deliverylog.StateDeadLettered, Derived: true, Note: hostile,
				DeadLetter: &deliverylog.Link{ID: "items:" + hostile + ":" + hostile},
				Attempts: []deliverylog.Attempt{{At: at, Attempt: 1, Outcome: deliverylog.OutcomeRetrying, Status: 503, Error: hostile, DurationMS: 12.5, Response: hostile, Replica: hostile},
					{At: at.Add(time.Second), Attempt: 2, Outcome: deliverylog.OutcomeDeadLettered, Status: 400, ErrorClass: "http_400", Error: hostile, DurationMS: 3, Replica: "r1"}}},
			{Sink: "audit", State: deliverylog.StateDelivered, Derived: true, Note: "the checkpoint is past it", Attempts: []deliverylog.Attempt{}},
		}}
}

func hostileRecord() deliverylog.Record {
	key, _ := bson.Marshal(bson.D{{Key: "_id", Value: hostile}})
	return deliverylog.Record{EventID: "items:" + hostile, Source: hostile, DB: hostile, Coll: hostile, Operation: hostile, Sink: hostile,
		Rules: []string{hostile}, DocumentKey: key, Attempt: 2, Outcome: deliverylog.OutcomeRetrying, Status: 503, Code: hostile,
		ErrorClass: hostile, Error: hostile, Response: hostile, Duration: 1500 * time.Millisecond, Replica: hostile, Time: time.Now()}
}

func hostileAnalytics() deliverylog.Analytics {
	g := deliverylog.Group{Name: hostile, Attempts: 3, Events: 5,
		ByOutcome:    map[deliverylog.Outcome]int64{deliverylog.OutcomeRetrying: 2, deliverylog.OutcomeDelivered: 3, deliverylog.Outcome(hostile): 1},
		ByOperation:  map[string]int64{hostile: 5},
		ByCollection: map[string]int64{hostile: 5},
		Latency:      deliverylog.Latency{Count: 3, P50: 10, P95: 80, P99: 120}}
	return deliverylog.Analytics{Window: "24h", Since: time.Now().Add(-24 * time.Hour), Until: time.Now(),
		Sinks: []deliverylog.Group{g}, Rules: []deliverylog.Group{g}, Covers: []string{hostile}}
}

// The delivery log's pages show hostile event ids, keys, names, error
// texts and receivers' answers as text.
func TestConsoleDeliveryPagesHostile(t *testing.T) {
	batch := hostileRecord()
	batch.BatchIDs = []string{"a:1", "a:2", "a:3", "a:4", "a:5", "a:6", "a:7"}
	pages := map[string]consolePage{
		"event":      {Error: hostile, Event: eventView(hostileLifecycle())},
		"deliveries": {Deliveries: &consoleDeliveries{Filter: url.Values{"document_key": {hostile}, "since": {hostile}}, Sinks: []string{hostile}, Records: []consoleRecord{recordView(hostileRecord()), recordView(batch)}}},
		"analytics":  {Analytics: analyticsView(hostileAnalytics())},
		"search":     {Error: hostile},
	}
	for name, p := range pages {
		p.Auth = config.ConsoleAuthNone
		body := render(t, name, p).Body.String()
		noHostileMarkup(t, name, body)
		if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Errorf("%s: the hostile text is not shown escaped", name)
		}
	}
	body := render(t, "event", pages["event"]).Body.String()
	for _, want := range []string{
		`data-state="dead_lettered" data-derived="1"`, `>derived</span>`, `data-sink="audit" data-state="delivered"`,
		// The dead letter's link is one path segment of the console.
		`href="/ui/deadletters/items:%3Cscript%3Ealert%281%29%3C%2Fscript%3E%22%27%3E%3Cimg%20src=x%20onerror=alert%282%29%3E:`,
		`<td class="num">12.5 ms</td>`, `data-outcome="dead_lettered"`, `id="event-acked">no `,
		`data-action="redeliver" data-id="items:&lt;script&gt;alert(1)&lt;/script&gt;&#34;&#39;&gt;&lt;img src=x onerror=alert(2)&gt;" data-sink="audit"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("event page lacks %s", want)
		}
	}
	body = render(t, "deliveries", pages["deliveries"]).Body.String()
	for _, want := range []string{`href="/ui/events/items:%3Cscript%3E`, "and 2 more", `<td class="num">1500 ms</td>`,
		// The key links its deliveries with the canonical form, one parameter.
		`href="/ui/deliveries?document_key=%7B%22_id%22%3A%22%3Cscript%3E`} {
		if !strings.Contains(body, want) {
			t.Errorf("deliveries page lacks %s", want)
		}
	}
	if n := strings.Count(body, `class="event-link"`); n != 1+consoleMaxBatchIDs {
		t.Errorf("%d event links, want %d", n, 1+consoleMaxBatchIDs)
	}
	body = render(t, "analytics", pages["analytics"]).Body.String()
	for _, want := range []string{`<svg class="chart"`, `<rect class="o-retrying"`, `<rect class="o-other"`, `<rect class="lat-p99"`, `class="here">24h</a>`} {
		if !strings.Contains(body, want) {
			t.Errorf("analytics page lacks %s", want)
		}
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{72 * time.Hour: "72h", 90 * time.Minute: "1h30m", time.Minute: "1m", 90 * time.Second: "1m30s"} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestSearchTarget(t *testing.T) {
	for _, c := range []struct{ q, want, err string }{
		{"", "/ui/deliveries", ""},
		{" items:8264F1A2000000012B ", "/ui/events/items:8264F1A2000000012B", ""},
		{"a/b:c?d", "/ui/events/a%2Fb:c%3Fd", ""},
		{`{"_id": 42}`, "/ui/deliveries?document_key=%7B%22_id%22%3A+42%7D", ""},
		{"42", "/ui/deliveries?document_key=%7B%22_id%22%3A+42%7D", ""},
		{`"order-7"`, "/ui/deliveries?document_key=%7B%22_id%22%3A+%22order-7%22%7D", ""},
		{"65F1A2B3C4D5E6F708192A3B", "/ui/deliveries?document_key=%7B%22_id%22%3A+%7B%22%24oid%22%3A+%2265f1a2b3c4d5e6f708192a3b%22%7D%7D", ""},
		{"order-7", "", "neither an event id"},
		{"NaN", "", "neither an event id"},
		{strings.Repeat("x", consoleMaxSearch+1), "", "at most 4096"},
	} {
		got, err := searchTarget(c.q)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("searchTarget(%.40q) = %q, %v; want %q, %q", c.q, got, err, c.want, c.err)
		}
	}
}

// The pages read the delivery log through the admin server's Deliveries,
// with the API's filters: a bad filter is a 400 with the API's message,
// the next page's link carries the filter and the cursor, an unknown event
// is a 404; the search box redirects; with console_auth "token" the pages
// are shells without the admin token.
func TestConsoleDeliveryPagesServed(t *testing.T) {
	rec := hostileRecord()
	dl := &fakeDeliveries{lifecycle: hostileLifecycle(), page: deliverylog.Page{Records: []deliverylog.Record{rec}, Next: "CURSOR-2"}, analytics: hostileAnalytics()}
	cfg := &config.Config{Server: config.Server{Console: true, PublicRead: true, AdminToken: "admin-token-admin-token"},
		DeliveryLog: config.DeliveryLog{Mode: config.DeliveryLogFailures, Retention: 72 * time.Hour}}
	gw := fixedGateway{cfg: cfg}
	admin := api.New(api.Options{Gateway: gw, Deliveries: dl, DeliveryLogDropped: func() int64 { return 7 }})
	New(admin, Options{Gateway: gw})
	srv := httptest.NewServer(admin)
	t.Cleanup(srv.Close)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (int, string, http.Header) {
		t.Helper()
		resp, err := noRedirect.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}

	code, body, _ := get("/ui/deliveries?status=failed&sink=hook&document_key=" + url.QueryEscape(`{"_id": 1}`) + "&min_attempts=2&min_duration=1s")
	if code != 200 || !strings.Contains(body, `<a id="next" href="/ui/deliveries?after=CURSOR-2&amp;document_key=%7B%22_id%22%3A&#43;1%7D&amp;min_attempts=2&amp;min_duration=1s&amp;sink=hook&amp;status=failed">`) {
		t.Fatalf("deliveries: %d\n%s", code, body)
	}
	f := dl.filters[len(dl.filters)-1]
	if f.Status != deliverylog.StatusFailed || f.Sink != "hook" || f.MinAttempts != 2 || f.MinDuration != time.Second || f.DocumentKey == nil {
		t.Errorf("filter %+v", f)
	}
	code, body, _ = get("/ui/deliveries?after=CURSOR-2&sink=hook")
	if code != 200 || !strings.Contains(body, `<a id="first" href="/ui/deliveries?sink=hook">`) || dl.filters[len(dl.filters)-1].Cursor != "CURSOR-2" {
		t.Errorf("second page: %d, cursor %q", code, dl.filters[len(dl.filters)-1].Cursor)
	}
	code, body, _ = get("/ui/deliveries?status=lost&document_key=" + url.QueryEscape(`{"$where": 1}`))
	if code != 400 || !strings.Contains(body, `status: &#34;lost&#34; is not one of`) {
		t.Errorf("bad filter: %d\n%s", code, body)
	}
	code, body, _ = get("/ui/events/" + url.PathEscape("items:"+hostile))
	if code != 200 || !strings.Contains(body, `id="event-id">items:&lt;script&gt;`) {
		t.Errorf("event page: %d\n%s", code, body)
	}
	if code, body, _ = get("/ui/events/items:nothing"); code != 404 || !strings.Contains(body, "event not found") {
		t.Errorf("unknown event: %d\n%s", code, body)
	}
	code, body, _ = get("/ui/analytics?window=7d")
	if code != 200 || !strings.Contains(body, `class="here">7d</a>`) || !strings.Contains(body, `which keeps its records for 72h (mode <code>"failures"</code>)`) || dl.windows[len(dl.windows)-1] != "7d" || dl.dropped[len(dl.dropped)-1] != 7 {
		t.Errorf("analytics: %d, windows %v, dropped %v", code, dl.windows, dl.dropped)
	}
	if code, body, _ = get("/ui/analytics?window=2d"); code != 400 || !strings.Contains(body, `window &#34;2d&#34;`) {
		t.Errorf("bad window: %d\n%s", code, body)
	}
	if code, _, h := get("/ui/search?q=" + url.QueryEscape("items:01")); code != http.StatusSeeOther || h.Get("Location") != "/ui/events/items:01" {
		t.Errorf("search: %d %q", code, h.Get("Location"))
	}
	if code, body, _ = get("/ui/search?q=" + url.QueryEscape(hostile)); code != 400 || !strings.Contains(body, "neither an event id") || strings.Contains(body, "<script>alert") {
		t.Errorf("bad search: %d\n%s", code, body)
	}

	// Token mode: shells without the token, data with it.
	cfg.Server.PublicRead = false
	for _, path := range []string{"/ui/deliveries", "/ui/events/" + url.PathEscape("items:"+hostile), "/ui/analytics"} {
		code, body, _ := get(path)
		if code != 401 || !strings.Contains(body, "data-locked") || strings.Contains(body, "alert(1)") || strings.Contains(body, "CURSOR-2") {
			t.Errorf("%s without the token: %d\n%s", path, code, body)
		}
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer admin-token-admin-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s with the token: %d", path, resp.StatusCode)
		}
	}
	// Without a delivery log: the pages say so.
	bare := api.New(api.Options{Gateway: fixedGateway{cfg: &config.Config{Server: config.Server{Console: true, PublicRead: true}}}})
	New(bare, Options{Gateway: fixedGateway{cfg: &config.Config{Server: config.Server{Console: true, PublicRead: true}}}})
	for _, path := range []string{"/ui/deliveries", "/ui/events/a:b", "/ui/analytics"} {
		w := httptest.NewRecorder()
		bare.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if w.Code != 404 || !strings.Contains(w.Body.String(), errNoDeliveryLog.Error()) {
			t.Errorf("%s without a delivery log: %d\n%s", path, w.Code, w.Body)
		}
	}
}

package console

import (
	"html/template"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/router"
)

const hostile = `<script>alert(1)</script>"'><img src=x onerror=alert(2)>`

// render renders page name with p and returns the response.
func render(t *testing.T, name string, p consolePage) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	renderConsole(w, http.StatusOK, name, p)
	if w.Code != http.StatusOK {
		t.Fatalf("%s: status %d: %s", name, w.Code, w.Body)
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("%s: Content-Security-Policy %q", name, csp)
	}
	if w.Header().Get("X-Content-Type-Options") != "nosniff" || w.Header().Get("Referrer-Policy") != "no-referrer" {
		t.Fatalf("%s: headers %v", name, w.Header())
	}
	return w
}

// noHostileMarkup fails if the hostile text appears unescaped: no tag or
// attribute from it may survive.
func noHostileMarkup(t *testing.T, name, body string) {
	t.Helper()
	for _, bad := range []string{"<script>alert", "<img src=x", `"><img`} {
		if strings.Contains(body, bad) {
			t.Errorf("%s: hostile text rendered as markup (%q found)", name, bad)
		}
	}
	// The only script tag is the console's own file.
	if n := strings.Count(body, "<script"); n != 1 || !strings.Contains(body, `<script src="/ui/static/console.js" defer></script>`) {
		t.Errorf("%s: %d script tags", name, n)
	}
}

func TestConsoleTemplatesEmpty(t *testing.T) {
	pages := map[string]consolePage{
		"overview":    {Overview: buildOverview(api.Status{Ready: true}, nil)},
		"deadletters": {DeadLetters: &consoleDeadLetters{}},
		"deadletter":  {Error: "no dead letter"},
		"rules":       {Rules: &consoleRules{}},
	}
	for name, p := range pages {
		p.Auth = config.ConsoleAuthNone
		body := render(t, name, p).Body.String()
		noHostileMarkup(t, name, body)
	}
	// The locked shell shows no data.
	p := consolePage{Locked: true, Auth: config.ConsoleAuthToken, Instance: "secret-instance", Overview: buildOverview(api.Status{Sources: []api.SourceStatus{{Name: "secret-source"}}}, nil)}
	body := render(t, "overview", p).Body.String()
	if strings.Contains(body, "secret-source") || strings.Contains(body, "secret-instance") || !strings.Contains(body, "data-locked") {
		t.Fatalf("locked shell shows data:\n%s", body)
	}
}

func TestConsoleTemplatesNormal(t *testing.T) {
	now := time.Now()
	var samples []consoleSample
	for i := range 7 {
		samples = append(samples, consoleSample{
			at:        now.Add(time.Duration(i-6) * consoleSampleEvery),
			lag:       map[string]float64{"orders": float64(i)},
			read:      map[string]float64{"orders": float64(100 * i)},
			delivered: map[string]float64{"hook": float64(60 * i)},
			failed:    map[string]float64{"hook": float64(i)},
			deadLetters: map[string]float64{
				"hook\x00failed": 3, "hook\x00parked": 0,
			},
		})
	}
	r := api.Status{Ready: false, Sources: []api.SourceStatus{
		{Name: "orders", Source: "orders", State: "open", Ready: true, CheckpointLagSec: 6, CheckpointTime: now},
		{Name: "users", Source: "users", State: "reconnecting", Reason: "change stream is reconnecting"},
	}, Sinks: []api.SinkStatus{
		{Name: "hook", Ready: true, Failing: true, LastError: "webhook hook: HTTP 503", ConcurrencyLimit: 8, Adaptive: true},
		{Name: "bus", Ready: true},
		{Name: "queue", Parked: true, Ready: true},
	}}
	o := buildOverview(r, samples)
	if got := []string{o.Sources[0].Health, o.Sources[1].Health, o.Sinks[0].Health, o.Sinks[1].Health, o.Sinks[2].Health}; strings.Join(got, " ") != "green red amber green red" {
		t.Fatalf("health %v", got)
	}
	// 100 events per 10 s sample: 10/s; 60 deliveries per sample: 360/min.
	if o.Sources[0].EventsPerSec != 10 || o.Sinks[0].DeliveredPerMin != 360 || o.Sinks[0].FailedPerMin != 6 || o.Sinks[0].FailedEntries != 3 {
		t.Fatalf("rates: %v/s, %v delivered/min, %v failed/min, %v failed entries", o.Sources[0].EventsPerSec, o.Sinks[0].DeliveredPerMin, o.Sinks[0].FailedPerMin, o.Sinks[0].FailedEntries)
	}
	if o.Sources[0].Lag.N != 7 || o.Sources[0].Rate.N != 6 || !math.IsNaN(o.Sources[1].EventsPerSec) {
		t.Fatalf("sparklines: lag %d points, rate %d points, users %v/s", o.Sources[0].Lag.N, o.Sources[0].Rate.N, o.Sources[1].EventsPerSec)
	}
	body := render(t, "overview", consolePage{Auth: "none", Refresh: 5, Overview: o}).Body.String()
	for _, want := range []string{`data-name="orders" data-health="green"`, `data-name="users" data-health="red"`, `data-name="queue" data-health="red" data-state="parked"`, "<polyline points=", "webhook hook: HTTP 503", `data-refresh="5"`} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
}

func TestConsoleTemplatesHostile(t *testing.T) {
	key, _ := bson.Marshal(bson.D{{Key: "_id", Value: hostile}})
	e := deadletter.Entry{
		ID: "items:" + hostile + ":hook", Kind: deadletter.KindFailed, Source: hostile, Sink: hostile, Operation: hostile,
		DocumentKey: key, Reason: hostile, FirstError: hostile, LastError: hostile, Rules: []string{hostile}, Namespace: hostile,
		CreatedAt: time.Now(),
	}
	r := api.Status{
		Reason: hostile, Cluster: true, Members: []string{hostile},
		Units:   []api.UnitStatus{{Name: hostile, Owner: hostile}},
		Sources: []api.SourceStatus{{Name: hostile, Source: hostile, State: hostile, Reason: hostile}},
		Sinks:   []api.SinkStatus{{Name: hostile, LastError: hostile, Reason: hostile, Circuit: hostile}},
	}
	rules := &consoleRules{Sources: []consoleRuleSource{{Name: hostile, Stage: hostile, Rules: []consoleRule{{Name: hostile, Filter: hostile, Pushed: hostile, Sinks: hostile}}}}}
	pages := map[string]consolePage{
		"overview":    {Instance: hostile, Error: hostile, Overview: buildOverview(r, nil)},
		"deadletters": {Error: hostile, DeadLetters: &consoleDeadLetters{Filter: map[string][]string{"since": {hostile}, "document_key": {hostile}}, Sinks: []string{hostile}, Entries: []consoleEntrySummary{summaryOf(e)}}},
		"deadletter":  {Entry: entryView(e)},
		"rules":       {Rules: rules},
	}
	for name, p := range pages {
		p.Auth = config.ConsoleAuthNone
		body := render(t, name, p).Body.String()
		noHostileMarkup(t, name, body)
		if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") && !strings.Contains(body, `\u003cscript\u003ealert(1)`) {
			t.Errorf("%s: the hostile text is not shown escaped", name)
		}
	}
}

func TestConsoleRules(t *testing.T) {
	cfg, err := config.Parse("c.toml", []byte(`
[mongo]
uri = "mongodb://localhost"
[[sources]]
name = "orders"
database = "shop"
[[sources]]
name = "users"
[[sinks]]
name = "hook"
type = "webhook"
url = "http://localhost:8080/"
[[rules]]
name = "paid"
source = "orders"
operations = ["insert", "update"]
filter = { "fullDocument.status" = "paid" }
sinks = ["hook"]
[[rules]]
name = "risky"
source = "orders"
operations = ["delete"]
filter = { "fullDocument.name" = { "$regex" = "^(a+)+$" } }
sinks = ["hook"]
[[rules]]
name = "everything"
source = "users"
sinks = ["hook"]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	var specs []router.RuleSpec
	for _, r := range cfg.Rules {
		specs = append(specs, ruleSpec(r))
	}
	rules, err := router.CompileRules(specs, []string{"hook"})
	if err != nil {
		t.Fatal(err)
	}
	stages := map[string]bson.D{}
	for _, s := range cfg.Sources {
		if st, ok := rules.Pushdown(s.Name); ok {
			stages[s.Name] = st
		}
	}
	got := buildRules(cfg, stages, false, map[string]float64{"orders\x00paid": 7})
	if len(got.Sources) != 2 || len(got.Sources[0].Rules) != 2 || len(got.Sources[1].Rules) != 1 {
		t.Fatalf("rules %+v", got)
	}
	paid, risky, all := got.Sources[0].Rules[0], got.Sources[0].Rules[1], got.Sources[1].Rules[0]
	if paid.Matches != 7 || !strings.Contains(paid.Pushed, `"fullDocument.status":"paid"`) || !strings.Contains(paid.Pushed, `"insert"`) || paid.Why != "" {
		t.Errorf("paid: %+v", paid)
	}
	if !strings.Contains(risky.Pushed, `"delete"`) || strings.Contains(risky.Pushed, "regex") || !strings.Contains(risky.Why, "evaluated in changegate only") {
		t.Errorf("risky: %+v", risky)
	}
	if all.Pushed != "" || !strings.Contains(all.Why, "matches every change") || got.Sources[1].Stage != "" {
		t.Errorf("everything: %+v, stage %q", all, got.Sources[1].Stage)
	}
	if !strings.Contains(got.Sources[0].Stage, `"$match"`) || !strings.Contains(got.Sources[0].Stage, "invalidate") {
		t.Errorf("orders stage %q", got.Sources[0].Stage)
	}
	// The whole-cluster source's stream leaves out the state database
	// first; the page says so (it said the stream was not filtered).
	state := cfg.Mongo.StateDatabase
	if got.Sources[0].StateStage != "" || got.Sources[1].StateDB != state ||
		got.Sources[1].StateStage != `{"$match":{"ns.db":{"$ne":"`+state+`"}}}` {
		t.Errorf("state stages: orders %q, users %q %q", got.Sources[0].StateStage, got.Sources[1].StateDB, got.Sources[1].StateStage)
	}
	body := render(t, "rules", consolePage{Auth: "none", Rules: got}).Body.String()
	if !strings.Contains(body, `<pre class="stage state-db">`) || !strings.Contains(body, "Apart from the state database") ||
		strings.Count(body, "state-db") != 1 {
		t.Errorf("rules page does not show the state database stage once:\n%s", body)
	}
	if !strings.Contains(body, `data-rule="paid"`) || !strings.Contains(body, `<td class="num matches">7</td>`) {
		t.Errorf("rules page:\n%s", body)
	}
	off := buildRules(cfg, nil, true, nil)
	if r := off.Sources[0].Rules[0]; r.Pushed != "" || !strings.Contains(r.Why, "disabled") {
		t.Errorf("no pushdown: %+v", r)
	}
}

// TestConsoleNextPage: the next page's link keeps its query (the filter and
// after) intact, and an id that needs escaping stays one parameter.
func TestConsoleNextPage(t *testing.T) {
	next := url.Values{"sink": {"hook"}, "after": {"items:82&x=<y>/hook"}}
	d := &consoleDeadLetters{Entries: []consoleEntrySummary{{ID: "a"}}, Next: template.URL("/ui/deadletters?" + next.Encode())}
	body := render(t, "deadletters", consolePage{Auth: "none", DeadLetters: d}).Body.String()
	want := `<a id="next" href="/ui/deadletters?after=items%3A82%26x%3D%3Cy%3E%2Fhook&amp;sink=hook">`
	if !strings.Contains(body, want) {
		i := strings.Index(body, `id="next"`)
		t.Fatalf("next link: %s, want %s", body[max(0, i-3):min(len(body), i+120)], want)
	}
}

package app_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/test/mongotest"
)

// callBody is call with a request body and its Content-Type.
func callBody(t *testing.T, method, addr, path, token, ctype, body string, hdr ...string) (int, string) {
	t.Helper()
	return callWith(t, method, addr, path, token, strings.NewReader(body), append([]string{"Content-Type", ctype}, hdr...)...)
}

func callWith(t *testing.T, method, addr, path, token string, body *strings.Reader, hdr ...string) (int, string) {
	t.Helper()
	resp, b := do(t, method, addr, path, token, body, hdr...)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s %s: Content-Security-Policy %q", method, path, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("%s %s: security headers missing: %v", method, path, resp.Header)
		}
	}
	return resp.StatusCode, string(b)
}

const token = "s3cret-admin-token"

// TestConsoleHandlers drives the console of a running gateway: pages, the
// static files, the Host check, and the actions' token and Content-Type
// checks; a dead letter with a hostile error renders as text and is purged
// by id.
func TestConsoleHandlers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	cfg := e.config(hook.URL, "5s")
	g := start(t, cfg, app.Options{LoadConfig: func() (*config.Config, error) { return cfg, nil }})

	hostileErr := `webhook hook: POST: HTTP 400: <script>alert(1)</script>`
	dls := deadletter.NewStore(mongotest.Client(t, e.uri).Database(e.state), "deadletters")
	key, _ := bson.Marshal(bson.D{{Key: "_id", Value: `<img src=x onerror=alert(2)>`}})
	ent := deadletter.Entry{
		ID: deadletter.EntryID("items:00", "hook"), Kind: deadletter.KindFailed, EventID: "items:00", Source: "items", Sink: "hook",
		Operation: "insert", DocumentKey: key, Reason: "http_400", FirstError: hostileErr, LastError: hostileErr, Attempts: 1,
		FirstFailedAt: time.Now(), LastFailedAt: time.Now(),
	}
	ent2 := ent
	ent2.ID, ent2.EventID, ent2.DocumentKey, ent2.LastError, ent2.FirstError = deadletter.EntryID("items:01", "hook"), "items:01", nil, "plain error", "plain error"
	for _, en := range []deadletter.Entry{ent, ent2} {
		if err := dls.Put(context.Background(), en); err != nil {
			t.Fatal(err)
		}
	}
	// Paging: the next link carries the filter and after.
	// Reads follow the API's policy (admin_token set, no public_read): the
	// pages are read with the token.
	_, page1 := callWith(t, "GET", g.admin, "/ui/deadletters?sink=hook&limit=1", token, strings.NewReader(""))
	i := strings.Index(page1, `<a id="next" href="`)
	if i < 0 || strings.Count(page1, `class="deadletter"`) != 1 {
		t.Fatalf("first page of 1: no next link:\n%s", page1)
	}
	next := page1[i+len(`<a id="next" href="`):]
	next = strings.ReplaceAll(next[:strings.Index(next, `"`)], "&amp;", "&")
	code, page2 := callWith(t, "GET", g.admin, next, token, strings.NewReader(""))
	if code != 200 || strings.Count(page2, `class="deadletter"`) != 1 {
		t.Fatalf("second page %s: %d\n%s", next, code, page2)
	}
	if (strings.Contains(page1, "plain error")) == (strings.Contains(page2, "plain error")) {
		t.Fatalf("the two pages do not split the two entries")
	}

	for _, r := range []struct {
		method, path string
		hdr          []string
		want         int
		has          string
	}{
		{"GET", "/", nil, 200, `data-name="items"`},
		{"GET", "/", nil, 200, `data-name="hook"`},
		{"GET", "/ui/", nil, 200, `id="sources"`},
		{"GET", "/ui/rules", nil, 200, `data-rule="all"`},
		{"GET", "/ui/deadletters", nil, 200, `&lt;script&gt;alert(1)&lt;/script&gt;`},
		{"GET", "/ui/deadletters?sink=hook&kind=failed", nil, 200, `data-action="replay"`},
		{"GET", "/ui/deadletters?since=yesterday", nil, 400, `since: &#34;yesterday&#34;`},
		{"GET", "/ui/deadletters/" + ent.ID, nil, 200, `&lt;script&gt;alert(1)&lt;/script&gt;`},
		{"GET", "/ui/deadletters/nope", nil, 404, `no dead letter`},
		{"GET", "/ui/static/console.js", nil, 200, "sessionStorage"},
		{"GET", "/ui/static/console.css", nil, 200, ".health-red"},
		{"GET", "/ui/static/missing.js", nil, 404, ""},
		{"GET", "/ui/static/", nil, 404, ""},
		{"GET", "/nothing-here", nil, 404, ""},
		{"GET", "/", []string{"Host", "evil.example"}, 421, "allowed_hosts"},
	} {
		code, body := callWith(t, r.method, g.admin, r.path, token, strings.NewReader(""), r.hdr...)
		if code != r.want || !strings.Contains(body, r.has) {
			t.Errorf("%s %s %q: %d, want %d containing %q:\n%.2000s", r.method, r.path, r.hdr, code, r.want, r.has, body)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Errorf("%s %s: hostile text rendered as markup", r.method, r.path)
		}
	}
	if code, _ := callWith(t, "GET", g.admin, "/ui/static/console.js", "", strings.NewReader("")); code == 200 {
		resp, err := http.Get("http://" + g.admin + "/ui/static/console.js")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/javascript") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("console.js: Content-Type %q, nosniff %q", ct, resp.Header.Get("X-Content-Type-Options"))
		}
	}

	// Actions: the token, then a JSON Content-Type, then a valid body.
	for _, r := range []struct {
		method, path, token, ctype, body string
		hdr                              []string
		want                             int
		has                              string
	}{
		{"POST", "/ui/api/replay", "", "application/json", `{}`, nil, 401, "bearer token"},
		{"POST", "/ui/api/replay", "wrong-token-wrong-token", "application/json", `{}`, nil, 401, "bearer token"},
		{"DELETE", "/ui/api/deadletters", "", "application/json", `{"all":true}`, nil, 401, "bearer token"},
		{"POST", "/ui/api/reload", "", "application/json", `{}`, nil, 401, "bearer token"},
		{"POST", "/ui/api/replay", token, "text/plain", `{}`, nil, 415, "Content-Type: application/json"},
		{"POST", "/ui/api/replay", token, "application/x-www-form-urlencoded", `ids=x`, nil, 415, "Content-Type: application/json"},
		{"POST", "/ui/api/replay", token, "", `{}`, nil, 415, "Content-Type"},
		{"POST", "/ui/api/replay", token, "application/json", `ids=x`, nil, 400, "not JSON"},
		{"POST", "/ui/api/replay", token, "application/json", `{"sinks":"x"}`, nil, 400, "unknown field"},
		{"POST", "/ui/api/replay", token, "application/json", `{"ids":[]}`, nil, 400, "ids"},
		{"POST", "/ui/api/replay", token, "application/json", `{"kind":"parked"}`, nil, 400, "re-driven automatically"},
		{"POST", "/ui/api/replay", token, "application/json", `{"document_key":"{\"_id\":{\"$ne\":1}}"}`, nil, 400, "document key"},
		{"POST", "/ui/api/replay", token, "application/json", `{}`, []string{"Host", "evil.example"}, 421, "allowed_hosts"},
		{"GET", "/ui/api/replay", token, "application/json", `{}`, nil, 405, ""},
		{"DELETE", "/ui/api/deadletters", token, "application/json", `{}`, nil, 400, "all"},
		{"DELETE", "/ui/api/deadletters", token, "application/json", `{"ids":["other"]}`, nil, 200, `"purged": 0`},
		{"DELETE", "/ui/api/deadletters", token, "application/json; charset=utf-8", `{"ids":[` + jsonString(ent.ID) + `,` + jsonString(ent2.ID) + `]}`, nil, 200, `"purged": 2`},
		{"POST", "/ui/api/reload", token, "application/json", `{}`, nil, 200, "reloaded"},
	} {
		code, body := callBody(t, r.method, g.admin, r.path, r.token, r.ctype, r.body, r.hdr...)
		if code != r.want || !strings.Contains(body, r.has) {
			t.Errorf("%s %s (token %q, %q, %s): %d %s, want %d containing %q", r.method, r.path, r.token, r.ctype, r.body, code, body, r.want, r.has)
		}
	}
	if n, err := dls.Count(context.Background(), deadletter.Filter{}); err != nil || n != 0 {
		t.Errorf("%d dead letters left after the purge (%v)", n, err)
	}
}

func jsonString(s string) string {
	b, _ := bson.MarshalExtJSON(bson.D{{Key: "s", Value: s}}, false, false)
	return strings.TrimSuffix(strings.TrimPrefix(string(b), `{"s":`), "}")
}

// TestConsoleAuthToken: with console_auth = "token" a page without the
// token is the empty shell (401, no data); with it, the data. With
// console = false nothing of the console is served.
func TestConsoleAuthToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	cfg := e.config(hook.URL, "5s")
	cfg.Server.ConsoleAuth = config.ConsoleAuthToken
	cfg.Server.PublicRead = true // governs /api/v1 only
	g := start(t, cfg, app.Options{})
	for _, path := range []string{"/", "/ui/rules", "/ui/deadletters", "/ui/deadletters/x"} {
		code, body := callWith(t, "GET", g.admin, path, "", strings.NewReader(""))
		if code != http.StatusUnauthorized || !strings.Contains(body, "data-locked") || strings.Contains(body, `data-name="items"`) || strings.Contains(body, `data-rule="all"`) {
			t.Errorf("GET %s without token: %d, want 401 and the shell without data:\n%.1500s", path, code, body)
		}
		code, body = callWith(t, "GET", g.admin, path, "wrong-token-wrong-token", strings.NewReader(""))
		if code != http.StatusUnauthorized || strings.Contains(body, `data-name="items"`) {
			t.Errorf("GET %s with a wrong token: %d", path, code)
		}
	}
	code, body := callWith(t, "GET", g.admin, "/", token, strings.NewReader(""))
	if code != 200 || !strings.Contains(body, `data-name="items"`) || strings.Contains(body, "data-locked") {
		t.Errorf("GET / with the token: %d\n%.1500s", code, body)
	}
	if code, _ := callWith(t, "GET", g.admin, "/ui/static/console.js", "", strings.NewReader("")); code != 200 {
		t.Errorf("the script is public (no data): %d", code)
	}
	if code, _ := callWith(t, "GET", g.admin, "/api/v1/status", "", strings.NewReader("")); code != 200 {
		t.Errorf("public_read still serves /api/v1/status: %d", code)
	}
	g.stop(t, 10*time.Second)

	cfg = e.config(hook.URL, "5s")
	cfg.Server.Console = false
	g = start(t, cfg, app.Options{})
	for _, path := range []string{"/", "/ui/", "/ui/rules", "/ui/static/console.js"} {
		if code, _ := callWith(t, "GET", g.admin, path, "", strings.NewReader("")); code != 404 {
			t.Errorf("console = false: GET %s: %d, want 404", path, code)
		}
	}
	if code, _ := callBody(t, "POST", g.admin, "/ui/api/replay", token, "application/json", "{}"); code != 404 {
		t.Errorf("console = false: POST /ui/api/replay: %d, want 404", code)
	}
}

// TestConsoleFollowsReadPolicy: unless console_auth says otherwise, the
// console reads data only as the API does. With admin_token set and the
// console's defaults, a dead letter's page, the listing and the overview
// show nothing of a document or an error text without the token (401, as
// /api/v1 answers); with public_read they are open; without any token
// configured they are refused (403) like the API's reads; an explicit
// console_auth = "none" still opens them.
func TestConsoleFollowsReadPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	dls := deadletter.NewStore(mongotest.Client(t, e.uri).Database(e.state), "deadletters")
	change, _ := bson.Marshal(bson.D{{Key: "operationType", Value: "insert"},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: 7}, {Key: "ssn", Value: "SSN-123-45-6789"}, {Key: "salary", Value: 123456}}}})
	key, _ := bson.Marshal(bson.D{{Key: "_id", Value: 7}})
	ent := deadletter.Entry{
		ID: deadletter.EntryID("items:07", "hook"), Kind: deadletter.KindFailed, EventID: "items:07", Source: "items", Sink: "hook",
		Operation: "insert", DocumentKey: key, Change: change, Reason: "http_400",
		FirstError: "receiver said SECRET-ERROR-TEXT", LastError: "receiver said SECRET-ERROR-TEXT", Attempts: 1,
		FirstFailedAt: time.Now(), LastFailedAt: time.Now(),
	}
	if err := dls.Put(context.Background(), ent); err != nil {
		t.Fatal(err)
	}
	paths := []string{"/", "/ui/deadletters", "/ui/deadletters/" + ent.ID, "/ui/rules"}
	leaks := func(body string) bool {
		for _, s := range []string{"SSN-123-45-6789", "123456", "SECRET-ERROR-TEXT", `data-name="hook"`, `data-rule="all"`, `class="deadletter"`} {
			if strings.Contains(body, s) {
				return true
			}
		}
		return false
	}
	parse := func(server string) *config.Config {
		t.Helper()
		text := strings.NewReplacer("%URI%", e.uri, "%DB%", e.db, "%STATE%", e.state, "%URL%", hook.URL, "%GRACE%", "5s").Replace(configText)
		text = strings.Replace(text, `admin_token = "s3cret-admin-token"`, server, 1)
		cfg, err := config.Parse("test.toml", []byte(text), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatalf("config: %v", err)
		}
		return cfg
	}
	for _, tc := range []struct {
		name, server string
		auth         string // the console_auth in effect
		open         int    // the status without a token: 200 shows data
		withToken    int
	}{
		{"admin_token, defaults", `admin_token = "s3cret-admin-token"`, config.ConsoleAuthToken, 401, 200},
		{"admin_token, public_read", "admin_token = \"s3cret-admin-token\"\npublic_read = true", config.ConsoleAuthNone, 200, 200},
		{"no token, defaults", ``, config.ConsoleAuthToken, 403, 403},
		{"admin_token, console_auth none", "admin_token = \"s3cret-admin-token\"\nconsole_auth = \"none\"", config.ConsoleAuthNone, 200, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := parse(tc.server)
			if cfg.Server.ConsoleAuth != tc.auth {
				t.Fatalf("console_auth %q, want %q", cfg.Server.ConsoleAuth, tc.auth)
			}
			g := start(t, cfg, app.Options{})
			defer g.stop(t, 10*time.Second)
			for _, path := range paths {
				code, body := callWith(t, "GET", g.admin, path, "", strings.NewReader(""))
				if code != tc.open || (code == 200) != leaks(body) {
					t.Errorf("GET %s without a token: %d, want %d (data shown: %v):\n%.1500s", path, code, tc.open, leaks(body), body)
				}
				code, body = callWith(t, "GET", g.admin, path, token, strings.NewReader(""))
				if code != tc.withToken || (code == 200) != leaks(body) {
					t.Errorf("GET %s with the token: %d, want %d (data shown: %v)", path, code, tc.withToken, leaks(body))
				}
			}
			// The API agrees.
			code, _ := callWith(t, "GET", g.admin, "/api/v1/deadletters/"+ent.ID, "", strings.NewReader(""))
			if (code == 200) != (tc.open == 200) && tc.name != "admin_token, console_auth none" {
				t.Errorf("GET /api/v1/deadletters/{id} without a token: %d, the console %d", code, tc.open)
			}
		})
	}
}

// attr returns the (HTML-unescaped) value of the first attribute name="..."
// after marker in page.
func attr(t *testing.T, page, marker, name string) string {
	t.Helper()
	i := strings.Index(page, marker)
	if i < 0 {
		t.Fatalf("%s not in the page:\n%.3000s", marker, page)
	}
	rest := page[i:]
	j := strings.Index(rest, name+`="`)
	if j < 0 {
		t.Fatalf("no %s after %s:\n%.3000s", name, marker, rest)
	}
	rest = rest[j+len(name)+2:]
	return html.UnescapeString(rest[:strings.Index(rest, `"`)])
}

// TestConsoleBulkActionsCarryTheListingsFilter: "Purge matching" and
// "Replay matching" send exactly the listing's filter, document_key_bson
// included, and state how many entries that is; the next-page link keeps
// the filter too; an entry created after the listing was read is not
// touched.
func TestConsoleBulkActionsCarryTheListingsFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	g := start(t, e.config(hook.URL, "5s"), app.Options{})
	dls := deadletter.NewStore(mongotest.Client(t, e.uri).Database(e.state), "deadletters")
	created := time.Now().Add(-time.Minute)
	put := func(n int, sink string, id any, at time.Time) {
		t.Helper()
		key, _ := bson.Marshal(bson.D{{Key: "_id", Value: id}})
		ev := fmt.Sprintf("items:%02d", n)
		if err := dls.Put(context.Background(), deadletter.Entry{ID: deadletter.EntryID(ev, sink), Kind: deadletter.KindFailed, EventID: ev,
			Source: "items", Sink: sink, Operation: "insert", DocumentKey: key, Reason: "http_400", LastError: "x", Attempts: 1,
			FirstFailedAt: at, LastFailedAt: at, CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	odd := "\xff-not-utf8" // a key JSON cannot name: only document_key_bson selects it exactly
	for i, id := range []any{1, 2, 3, odd} {
		put(i, "crm", id, created)
	}
	put(9, "hook", odd, created)
	oddKey, _ := bson.Marshal(bson.D{{Key: "_id", Value: odd}})
	b64 := base64.StdEncoding.EncodeToString(oddKey)

	code, page := callWith(t, "GET", g.admin, "/ui/deadletters?sink=crm&limit=1&document_key_bson="+url.QueryEscape(b64), token, strings.NewReader(""))
	if code != 200 || strings.Count(page, `class="deadletter"`) != 1 {
		t.Fatalf("listing: %d\n%.3000s", code, page)
	}
	var sel map[string]any
	if err := json.Unmarshal([]byte(attr(t, page, `id="filter"`, "data-selection")), &sel); err != nil {
		t.Fatalf("data-selection: %v", err)
	}
	if sel["sink"] != "crm" || sel["document_key_bson"] != b64 || sel["until"] == nil || len(sel) != 3 {
		t.Fatalf("bulk selection %v: want sink, document_key_bson and until", sel)
	}
	if n := attr(t, page, `data-action="purge-filter"`, "data-count"); n != "1" {
		t.Errorf("purge count %s, want 1", n)
	}
	if n := attr(t, page, `data-action="replay-filter"`, "data-count"); n != "1" {
		t.Errorf("replay count %s, want 1", n)
	}
	if next := attr(t, page, `id="next"`, "href"); !strings.Contains(next, "document_key_bson="+url.QueryEscape(b64)) || !strings.Contains(next, "sink=crm") {
		t.Errorf("next page %s: the filter is lost", next)
	}
	body, _ := json.Marshal(sel)
	code, out := callBody(t, "DELETE", g.admin, "/ui/api/deadletters", token, "application/json", string(body))
	if code != 200 || !strings.Contains(out, `"purged": 1`) {
		t.Fatalf("purge matching: %d %s, want 1 purged", code, out)
	}
	if n, _ := dls.Count(context.Background(), deadletter.Filter{Sink: "crm"}); n != 3 {
		t.Fatalf("%d crm entries left, want 3", n)
	}

	// The sink's listing: its 3 entries; one created after the listing
	// was read is left alone.
	_, page = callWith(t, "GET", g.admin, "/ui/deadletters?sink=crm", token, strings.NewReader(""))
	if n := attr(t, page, `data-action="purge-filter"`, "data-count"); n != "3" {
		t.Errorf("purge count %s, want 3", n)
	}
	sels := attr(t, page, `id="filter"`, "data-selection")
	put(10, "crm", 10, time.Now().Add(time.Second))
	code, out = callBody(t, "DELETE", g.admin, "/ui/api/deadletters", token, "application/json", sels)
	if code != 200 || !strings.Contains(out, `"purged": 3`) {
		t.Fatalf("purge matching %s: %d %s, want 3 purged", sels, code, out)
	}
	if n, _ := dls.Count(context.Background(), deadletter.Filter{}); n != 2 {
		t.Errorf("%d entries left, want 2 (the other sink's, the newer one)", n)
	}
}

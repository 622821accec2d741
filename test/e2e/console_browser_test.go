package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
)

// EnvArtifacts names a directory where the browser test saves its
// screenshots (default: the test's temporary directory).
const EnvArtifacts = "CHANGEGATE_TEST_ARTIFACTS"

// EnvUpdateScreenshot, set to 1, makes TestConsoleInBrowser copy its
// overview screenshot (console-overview-traffic.png, rendered on every run)
// to docs/console.png, the picture the docs show:
//
//	CHANGEGATE_UPDATE_SCREENSHOT=1 go test ./test/e2e -run 'TestConsoleInBrowser$'
const EnvUpdateScreenshot = "CHANGEGATE_UPDATE_SCREENSHOT"

// docsScreenshot is the console's picture in the docs, relative to this
// package.
const docsScreenshot = "../../docs/console.png"

// xssError is what the failing webhook answers: it ends up in the dead
// letter's error text, which the console must show as text.
const xssError = `<script>alert(1)</script>`

// findChromium returns the path of a Chromium binary, or skips the test when
// there is none and CI is not set (with CI=true a missing browser fails).
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed and CI is set: the browser test must run (apt-get install chromium; .ci/run installs it)")
	}
	t.Skip("chromium is not installed: skipping the browser test of the console (apt-get install chromium to run it)")
	return ""
}

// evalUntil evaluates the JavaScript expression expr in the page until it
// returns true, or fails the test after d. It polls from Go: chromedp's
// Poll builds its predicate with new Function, which the console's CSP
// (rightly) refuses.
func evalUntil(t *testing.T, ctx context.Context, d time.Duration, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last error
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return
		}
		last = err
		if time.Now().After(deadline) {
			html, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("content").outerHTML`))
			t.Fatalf("browser: timed out after %v waiting for %s (%v); page:\n%.6000s", d, what, last, html)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shot saves a screenshot of the tab as dir/name. A page just navigated
// to may not be painted yet ("Cannot take screenshot with 0 width"): it
// tries again for a second.
func shot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	for i := 0; err != nil && i < 5; i++ {
		time.Sleep(200 * time.Millisecond)
		png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name), png, 0o644)
	}
	if err != nil {
		t.Fatalf("browser: screenshot %s: %v", name, err)
	}
}

// artifactsDir returns $CHANGEGATE_TEST_ARTIFACTS (created) or a temporary
// directory.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(EnvArtifacts)
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func evalString(t *testing.T, ctx context.Context, expr string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		t.Fatalf("browser: %s: %v", expr, err)
	}
	return s
}

// newBrowser starts headless Chromium for the test (stopped at cleanup) and
// returns its tab's context. Every page of the tab records calls of alert
// in window.__alerts: a script injected into the console would call it.
func newBrowser(t *testing.T, chromium string) context.Context {
	t.Helper()
	actx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1400, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(actx, opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	if _, err := chromedp.Call(bctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
		Source: `window.__alerts = []; window.alert = function (m) { window.__alerts.push(String(m)); };
window.__confirms = []; window.confirm = function (m) { window.__confirms.push(String(m)); return true; };`,
	}); err != nil {
		t.Fatalf("browser: %v", err)
	}
	return bctx
}

// TestConsoleInBrowser loads the console of a running changegate in
// headless Chromium: the source and the sink appear with their states, the
// dead letters of a failing webhook appear with the hostile error text and
// document key rendered as text (no script ran), and the replay button,
// with the admin token entered in the page, replays one: the receiver gets
// the event.
func TestConsoleInBrowser(t *testing.T) {
	chromium := findChromium(t)
	e := newEnv(t)

	var failing atomic.Bool
	failing.Store(true)
	var mu sync.Mutex
	var accepted []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if failing.Load() {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, xssError)
			return
		}
		mu.Lock()
		accepted = append(accepted, string(b))
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	received := func(key string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, b := range accepted {
			if strings.Contains(b, `"documentKey":{"_id":`+key+`}`) {
				return true
			}
		}
		return false
	}

	const token = "browser-test-admin-token"
	// Reads are opened explicitly (the default with an admin token follows
	// the API: token needed, TestConsoleTokenInBrowser), so the first steps
	// read without the token.
	cfg := e.config(strings.Replace(baseConfig(hook.URL, ""), `shutdown_grace = "10s"`, `shutdown_grace = "10s"
admin_token = "`+token+`"
console_auth = "none"`, 1))
	g := e.startWith(cfg, app.Options{ConsoleSampleEvery: 200 * time.Millisecond})
	c := e.coll("items")
	ctx := context.Background()
	hostileKey := `<img src=x onerror=alert(2)>`
	for _, id := range []any{1, hostileKey} {
		if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "n", Value: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	var list struct {
		Entries []struct{ ID, DocumentKey json.RawMessage }
	}
	waitFor(t, 20*time.Second, "2 dead letters", func() bool {
		api(t, "GET", g.admin, "/api/v1/deadletters?kind=failed", token, &list)
		return len(list.Entries) == 2
	})
	var replayID string
	for _, en := range list.Entries {
		if string(en.DocumentKey) == `{"_id":1}` {
			_ = json.Unmarshal(en.ID, &replayID)
		}
	}
	if replayID == "" {
		t.Fatalf("no dead letter of document 1: %+v", list)
	}

	artifacts := artifactsDir(t)

	bctx := newBrowser(t, chromium)
	base := "http://" + g.admin

	// Overview: the source is open and green; the sink failed (a 400 is
	// permanent: it dead-letters and goes on), so it is amber, not red.
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the source row", `!!document.querySelector('#sources tr.source[data-name="items"][data-health="green"]')`)
	if st := evalString(t, bctx, `document.querySelector('#sources tr[data-name="items"] td.state').textContent.trim()`); st != "open" {
		t.Errorf("source state %q, want open", st)
	}
	evalUntil(t, bctx, 10*time.Second, "the sink row", `!!document.querySelector('#sinks tr.sink[data-name="hook"]')`)
	// The sink dead-lettered two events in the last minute: amber.
	evalUntil(t, bctx, 10*time.Second, "the sink amber", `document.querySelector('#sinks tr[data-name="hook"]').dataset.health === 'amber'`)
	if st := evalString(t, bctx, `document.querySelector('#sinks tr[data-name="hook"]').dataset.state`); st != "failures in the last minute" {
		t.Errorf("sink state %q, want failures in the last minute", st)
	}
	// The last error is the permanent failure, shown as text, and the cell
	// points to the dead letters.
	evalUntil(t, bctx, 10*time.Second, "the link to the sink's dead letters", `(function () {
		var a = document.querySelector('#sinks tr[data-name="hook"] td.error-text a');
		return !!a && a.getAttribute('href').indexOf('sink=hook') >= 0;
	})()`)
	// The page refreshes itself and draws sparklines from the samples.
	evalUntil(t, bctx, 10*time.Second, "a sparkline", `!!document.querySelector('#sources svg.spark polyline')`)
	shot(t, bctx, artifacts, "console-overview.png")

	// Dead letters: both entries, the hostile texts as text.
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/ui/deadletters")); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "2 dead letters", `document.querySelectorAll('#deadletters tr.deadletter').length === 2`)
	if n := evalString(t, bctx, `String(document.querySelectorAll('script').length) + ' ' + String(document.querySelectorAll('main img').length)`); n != "1 0" {
		t.Errorf("scripts and images in the page: %s, want 1 (the console's own) and 0", n)
	}
	if got := evalString(t, bctx, `Array.from(document.querySelectorAll('#deadletters td.error-text')).map(function (td) { return td.textContent; }).join('|')`); strings.Count(got, xssError) != 2 {
		t.Errorf("error cells %q: want the hostile error as text twice", got)
	}
	if got := evalString(t, bctx, `Array.from(document.querySelectorAll('#deadletters td.key')).map(function (td) { return td.textContent; }).join('|')`); !strings.Contains(got, hostileKey) {
		t.Errorf("document key cells %q: want %q as text", got, hostileKey)
	}
	shot(t, bctx, artifacts, "console-deadletters.png")

	// Replay without a token: refused in the page, nothing delivered.
	failing.Store(false)
	sel := fmt.Sprintf(`#deadletters tr.deadletter[data-id=%q] button[data-action="replay"]`, replayID)
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(sel))); err != nil {
		t.Fatalf("browser: click replay: %v", err)
	}
	evalUntil(t, bctx, 5*time.Second, "the token prompt", `document.getElementById('flash').textContent.indexOf('need the admin token') >= 0`)
	// Enter the token once (kept in sessionStorage), then replay.
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
	); err != nil {
		t.Fatalf("browser: token: %v", err)
	}
	evalUntil(t, bctx, 5*time.Second, "the token kept", `sessionStorage.getItem('changegate.adminToken') === '`+token+`' && document.cookie === ''`)
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(sel))); err != nil {
		t.Fatalf("browser: click replay: %v", err)
	}
	evalUntil(t, bctx, 20*time.Second, "the replay's report", `document.getElementById('flash').textContent.indexOf('Replayed 1,') >= 0`)
	waitFor(t, 10*time.Second, "the replayed event at the receiver", func() bool { return received("1") })
	// The page refreshed after the action: one entry left, the hostile one.
	evalUntil(t, bctx, 10*time.Second, "1 dead letter left", `document.querySelectorAll('#deadletters tr.deadletter').length === 1`)
	if alerts := evalString(t, bctx, `JSON.stringify(window.__alerts)`); alerts != "[]" {
		t.Errorf("alert was called: %s", alerts)
	}
	shot(t, bctx, artifacts, "console-after-replay.png")
	// The dead letter's own page: the full entry and its error as text.
	left := evalString(t, bctx, `document.querySelector('#deadletters tr.deadletter').dataset.id`)
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/ui/deadletters/"+url.PathEscape(left))); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the entry page", `!!document.getElementById('entry-json') && document.getElementById('entry-error').textContent.indexOf('<script>alert(1)</script>') >= 0 && document.getElementById('entry-json').textContent.indexOf('"envelope"') >= 0`)
	if alerts := evalString(t, bctx, `JSON.stringify(window.__alerts)`); alerts != "[]" {
		t.Errorf("alert was called: %s", alerts)
	}
	shot(t, bctx, artifacts, "console-deadletter.png")

	// Traffic, now that the webhook accepts: the overview counts the
	// deliveries and draws them (samples every 200ms here).
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("browser: %v", err)
	}
	for i := range 20 {
		insertN(t, c, 100+10*i, 10)
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, 20*time.Second, "200 deliveries", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted) >= 201
	})
	evalUntil(t, bctx, 15*time.Second, "the deliveries counted and drawn", `(function () {
		var r = document.querySelector('#sinks tr[data-name="hook"]');
		return parseFloat(r.querySelector('td.delivered').textContent) >= 200 && !!r.querySelector('svg.spark polyline');
	})()`)
	shot(t, bctx, artifacts, "console-overview-traffic.png")

	// Bulk actions act on exactly the listing's filter: with two dead
	// letters of the sink, the listing of one (by document_key_bson) offers
	// to purge 1, says so before the confirmation, and purges that one.
	failing.Store(true)
	for _, id := range []string{"bulk-a", "bulk-b"} {
		if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "the 2 bulk dead letters", func() bool {
		api(t, "GET", g.admin, "/api/v1/deadletters?kind=failed&sink=hook", token, &list)
		n := 0
		for _, en := range list.Entries {
			if strings.Contains(string(en.DocumentKey), "bulk-") {
				n++
			}
		}
		return n == 2
	})
	keyA, _ := bson.Marshal(bson.D{{Key: "_id", Value: "bulk-a"}})
	b64 := base64.StdEncoding.EncodeToString(keyA)
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/ui/deadletters?sink=hook&document_key_bson="+url.QueryEscape(b64))); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the listing of one", `document.querySelectorAll('#deadletters tr.deadletter').length === 1 && document.querySelector('button[data-action="purge-filter"]').dataset.count === '1'`)
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`button[data-action="purge-filter"]`))); err != nil {
		t.Fatalf("browser: click purge matching: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the purge's report", `document.getElementById('flash').textContent.indexOf('Purged 1.') >= 0`)
	if got := evalString(t, bctx, `window.__confirms.join('|')`); !strings.Contains(got, "Purge 1 dead letter(s)") || !strings.Contains(got, "document_key_bson="+b64) {
		t.Errorf("confirmation %q: want the count (1) and the filter", got)
	}
	api(t, "GET", g.admin, "/api/v1/deadletters?sink=hook", token, &list)
	var keys []string
	for _, en := range list.Entries {
		keys = append(keys, string(en.DocumentKey))
	}
	if !slices.Contains(keys, `{"_id":"bulk-b"}`) || slices.Contains(keys, `{"_id":"bulk-a"}`) {
		t.Errorf("dead letters left %v: want bulk-b's, not bulk-a's", keys)
	}
	t.Logf("screenshots in %s", artifacts)
	if os.Getenv(EnvUpdateScreenshot) == "1" {
		png, err := os.ReadFile(filepath.Join(artifacts, "console-overview-traffic.png"))
		if err == nil {
			err = os.WriteFile(docsScreenshot, png, 0o644)
		}
		if err != nil {
			t.Fatalf("%s=1: %v", EnvUpdateScreenshot, err)
		}
		t.Logf("wrote %s", docsScreenshot)
	}
}

// TestConsoleTokenInBrowser: with an admin token and console_auth unset
// (it follows the API's read policy: "token" without public_read) the console loads
// empty; once the admin token is entered, the page's script fetches the
// data with it and shows it, and other pages of the tab load their data
// with the token kept in sessionStorage (no cookie).
func TestConsoleTokenInBrowser(t *testing.T) {
	chromium := findChromium(t)
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	const token = "browser-test-admin-token"
	cfg := e.config(strings.Replace(baseConfig(hook.URL, ""), `shutdown_grace = "10s"`, `shutdown_grace = "10s"
admin_token = "`+token+`"`, 1))
	g := e.start(cfg)
	insertN(t, e.coll("items"), 0, 3)
	bctx := newBrowser(t, chromium)
	base := "http://" + g.admin

	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the locked shell", `document.body.hasAttribute('data-locked') && !!document.querySelector('main p.locked')`)
	if n := evalString(t, bctx, `String(document.querySelectorAll('#sources, #sinks').length)`); n != "0" {
		t.Fatalf("the locked shell shows data")
	}
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS("#token"), "wrong-token-wrong-token"),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
	); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the wrong token refused", `document.getElementById('flash').textContent.indexOf('refused') >= 0 && !document.querySelector('#sources')`)
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
	); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the data with the token", `!!document.querySelector('#sources tr.source[data-name="items"]') && !!document.querySelector('#sinks tr.sink[data-name="hook"]') && !document.body.hasAttribute('data-locked') && document.body.getAttribute('data-refresh') === '5' && document.title === 'Overview · changegate'`)
	// Another page of the tab: the shell loads, then its data with the
	// kept token; the rules page counts the matches.
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/ui/rules")); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the rules with their matches", `(function () {
		var r = document.querySelector('tr.rule[data-rule="all"]');
		return !!r && r.querySelector('td.matches').textContent.trim() === '3';
	})()`)
	if c := evalString(t, bctx, `document.cookie`); c != "" {
		t.Errorf("cookies set: %q", c)
	}
	shot(t, bctx, artifactsDir(t), "console-rules.png")
}

package e2e

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// navigate loads url in the tab.
func navigate(t *testing.T, ctx context.Context, u string) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Navigate(u)); err != nil {
		t.Fatalf("browser: navigate %s: %v", u, err)
	}
}

// search types q in the header's search box and submits it.
func search(t *testing.T, ctx context.Context, q string) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS("#search-q"), q),
		chromedp.Submit(chromedp.CSS("#search")),
	); err != nil {
		t.Fatalf("browser: search %q: %v", q, err)
	}
}

// TestConsoleDeliveryLogInBrowser: a receiver refuses one document (400,
// a hostile answer, a hostile key) and fails another once (503). In
// headless Chromium the search box finds the second by its bare _id (the
// failures view filtered by its key, its retry listed) and its event page
// by its id (the timeline with the 503, delivered once the checkpoint is
// past it, derived); the refused one's event page shows it dead-lettered
// with a link to its dead letter and the hostile texts as text; the
// analytics page changes window and draws its charts. The event page's
// button redelivers the event to its sink.
func TestConsoleDeliveryLogInBrowser(t *testing.T) {
	chromium := findChromium(t)
	e := newEnv(t)
	const hostileKey = `<img src=x onerror=alert(2)>`
	var mu sync.Mutex
	failedOnce := false
	doc2 := 0 // doc-2's requests taken
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.Contains(string(b), `onerror=alert(2)`):
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, xssError)
		case strings.Contains(string(b), `"doc-2"`) && !failedOnce:
			failedOnce = true
			w.WriteHeader(http.StatusServiceUnavailable)
		case strings.Contains(string(b), `"doc-2"`):
			doc2++
		}
	}))
	t.Cleanup(hook.Close)
	const token = "browser-test-admin-token"
	cfg := e.config(strings.Replace(baseConfig(hook.URL, ""), `shutdown_grace = "10s"`, `shutdown_grace = "10s"
admin_token = "`+token+`"
console_auth = "none"`, 1))
	g := e.start(cfg)
	c := e.coll("items")
	for _, id := range []string{"doc-1", "doc-2", hostileKey} {
		if _, err := c.InsertOne(context.Background(), bson.D{{Key: "_id", Value: id}}); err != nil {
			t.Fatal(err)
		}
	}
	var records struct {
		Records []struct {
			EventIDs []string `json:"event_ids"`
			Outcome  string   `json:"outcome"`
			Keys     []any    `json:"document_keys"`
		} `json:"records"`
	}
	var retriedID, refusedID string
	waitFor(t, 30*time.Second, "the retry and the dead letter in the delivery log", func() bool {
		api(t, "GET", g.admin, "/api/v1/deliveries", token, &records)
		for _, r := range records.Records {
			switch {
			case r.Outcome == "retrying":
				retriedID = r.EventIDs[0]
			case r.Outcome == "dead_lettered":
				refusedID = r.EventIDs[0]
			}
		}
		return retriedID != "" && refusedID != ""
	})

	bctx := newBrowser(t, chromium)
	base := "http://" + g.admin
	artifacts := artifactsDir(t)

	// A bare _id in the search box: the deliveries of that document.
	navigate(t, bctx, base+"/")
	search(t, bctx, `"doc-2"`)
	evalUntil(t, bctx, 10*time.Second, "the deliveries of doc-2", `location.pathname === '/ui/deliveries' && document.querySelectorAll('#deliveries tr.delivery[data-outcome="retrying"]').length === 1 && document.querySelector('input[name="document_key"]').value === '{"_id": "doc-2"}'`)
	if got := evalString(t, bctx, `document.querySelector('#deliveries tr.delivery a.event-link').textContent`); got != retriedID {
		t.Errorf("the listing links event %q, want %q", got, retriedID)
	}
	shot(t, bctx, artifacts, "console-deliveries.png")
	// Its event page: the 503, then delivered (derived: the default mode
	// records no success) once the checkpoint is past it.
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#deliveries a.event-link`))); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the event page of doc-2", `document.getElementById('event-id') && document.getElementById('event-id').textContent === '`+retriedID+`' && !!document.querySelector('section.event-sink[data-sink="hook"] tr.attempt[data-outcome="retrying"]')`)
	if st := evalString(t, bctx, `document.querySelector('section.event-sink[data-sink="hook"] tr.attempt td.status').textContent.trim()`); !strings.HasPrefix(st, "503") {
		t.Errorf("the attempt's status %q, want 503", st)
	}
	waitFor(t, 20*time.Second, "doc-2 delivered, derived", func() bool {
		navigate(t, bctx, base+"/ui/events/"+url.PathEscape(retriedID))
		return evalString(t, bctx, `(function () { var s = document.querySelector('section.event-sink[data-sink="hook"]'); return s ? s.dataset.state + ' ' + (s.dataset.derived || '') : ''; })()`) == "delivered 1"
	})
	shot(t, bctx, artifacts, "console-event.png")
	// Redeliver it to the sink from its page (the admin token entered):
	// the receiver takes it once more.
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.Click(chromedp.CSS(`section.event-sink[data-sink="hook"] button[data-action="redeliver"]`)),
	); err != nil {
		t.Fatalf("browser: redeliver: %v", err)
	}
	evalUntil(t, bctx, 20*time.Second, "the redelivery's report", `document.getElementById('flash').textContent === 'Redelivered to hook (delivered).'`)
	mu.Lock()
	taken := doc2
	mu.Unlock()
	if taken != 2 {
		t.Errorf("the receiver took doc-2 %d times, want 2 (its delivery, then the redelivery)", taken)
	}

	// An event id in the search box: the refused event, dead-lettered,
	// its hostile answer and key shown as text, its dead letter linked.
	search(t, bctx, refusedID)
	evalUntil(t, bctx, 10*time.Second, "the refused event's page", `!!document.querySelector('section.event-sink[data-sink="hook"][data-state="dead_lettered"] a.dead-letter') && document.querySelector('section.event-sink[data-sink="hook"] td.reply').textContent.indexOf('`+xssError+`') >= 0`)
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`a.dead-letter`))); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "its dead letter", `!!document.getElementById('entry-json') && document.getElementById('entry-json').textContent.indexOf('onerror=alert(2)') >= 0`)

	// The failures view lists it with its hostile key as text.
	navigate(t, bctx, base+"/ui/deliveries?status=dead_lettered")
	evalUntil(t, bctx, 10*time.Second, "the dead-lettered record", `document.querySelectorAll('#deliveries tr.delivery').length === 1 && document.querySelector('#deliveries td.key').textContent.indexOf('`+hostileKey+`') >= 0`)
	if n := evalString(t, bctx, `String(document.querySelectorAll('main img, main script').length)`); n != "0" {
		t.Errorf("%s elements from data in the page", n)
	}

	// Analytics: 24h by default; the 1h link changes the window.
	navigate(t, bctx, base+"/ui/analytics")
	evalUntil(t, bctx, 10*time.Second, "the analytics of 24h", `document.querySelector('#windows a.here').dataset.window === '24h' && !!document.querySelector('tr.group[data-name="hook"]')`)
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#windows a[data-window="1h"]`))); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the analytics of 1h", `location.search === '?window=1h' && document.querySelector('#windows a.here').dataset.window === '1h' && parseInt(document.querySelector('tr.group[data-name="hook"]').dataset.events, 10) >= 2 && document.querySelectorAll('svg.chart rect.o-dead_lettered').length >= 1 && document.getElementById('analytics-covers').textContent.indexOf('mode "failures"') >= 0`)
	shot(t, bctx, artifacts, "console-analytics.png")
	if alerts := evalString(t, bctx, `JSON.stringify(window.__alerts)`); alerts != "[]" {
		t.Errorf("alert was called: %s", alerts)
	}
}

package e2e

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleSubscriptionsInBrowser: in headless Chromium the
// subscriptions page is a shell without a token (console_auth "none"
// notwithstanding); with a [[server.tokens]] token it lists that token's
// subscriptions, creates one from the form (the signing secret shown once,
// outside the page's content, gone once dismissed and after a reload, and
// never in the API's answers afterwards), pauses it (the API says paused)
// and rotates its secret (a new one, shown once).
func TestConsoleSubscriptionsInBrowser(t *testing.T) {
	chromium := findChromium(t)
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	keyFile := filepath.Join(t.TempDir(), "subscriptions.key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))), 0o600); err != nil {
		t.Fatal(err)
	}
	const admin, teamA = "browser-test-admin-token", "browser-test-team-a-token"
	cfg := e.config(strings.Replace(baseConfig(hook.URL, ""), `shutdown_grace = "10s"`, `shutdown_grace = "10s"
admin_token = "`+admin+`"
console_auth = "none"`, 1) + `
[[server.tokens]]
name = "team-a"
token = "` + teamA + `"
prefix = "team-a-"

[subscriptions]
enabled = true
key_file = "` + keyFile + `"
allow_private_networks = true
`)
	g := e.start(cfg)
	bctx := newBrowser(t, chromium)
	base := "http://" + g.admin
	artifacts := artifactsDir(t)

	navigate(t, bctx, base+"/ui/subscriptions")
	evalUntil(t, bctx, 10*time.Second, "the locked shell", `document.body.hasAttribute('data-locked') && !document.getElementById('subscription-create')`)
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS("#token"), teamA),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
	); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "team-a's empty page", `!!document.getElementById('no-subscriptions') && document.querySelector('#subscription-create input[name="name"]').value === 'team-a-'`)

	// Create: the secret is shown once.
	if err := chromedp.Do(bctx,
		chromedp.SetValue(chromedp.CSS(`#subscription-create input[name="name"]`), "team-a-hook"),
		chromedp.Click(chromedp.CSS(`#subscription-create input[name="operations"][value="insert"]`)),
		chromedp.SetValue(chromedp.CSS(`#subscription-create textarea[name="filter"]`), `{"fullDocument.n": {"$gte": 1}}`),
		chromedp.SetValue(chromedp.CSS(`#subscription-create input[name="url"]`), hook.URL+"/team-a"),
		chromedp.SetValue(chromedp.CSS(`#subscription-create textarea[name="headers"]`), "X-Key: header-value-never-shown"),
		chromedp.SetValue(chromedp.CSS(`#subscription-create input[name="batch_size"]`), "5"),
		chromedp.Click(chromedp.CSS(`#subscription-create button[type="submit"]`)),
	); err != nil {
		t.Fatalf("browser: create: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the secret and the new row", `!!document.getElementById('secret-value') && document.getElementById('secret-value').textContent.indexOf('whsec_') === 0 && !!document.querySelector('#subscriptions tr.subscription[data-name="team-a-hook"][data-status="active"]')`)
	secret := evalString(t, bctx, `document.getElementById('secret-value').textContent`)
	if n := evalString(t, bctx, `String(document.documentElement.outerHTML.split('`+secret+`').length - 1) + ' ' + String(document.getElementById('content').innerHTML.indexOf('`+secret+`'))`); n != "1 -1" {
		t.Errorf("the secret appears (count, index in the content) %s: want once, outside the content", n)
	}
	if got := evalString(t, bctx, `document.querySelector('#subscriptions tr[data-name="team-a-hook"] td.url').textContent`); !strings.Contains(got, "headers X-Key (values not shown)") || strings.Contains(got, "header-value-never-shown") {
		t.Errorf("webhook cell %q", got)
	}
	shot(t, bctx, artifacts, "console-subscription-created.png")
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#secret-done`))); err != nil {
		t.Fatalf("browser: %v", err)
	}
	evalUntil(t, bctx, 5*time.Second, "the secret gone", `document.getElementById('secret-once').hidden && document.documentElement.outerHTML.indexOf('`+secret+`') < 0`)
	navigate(t, bctx, base+"/ui/subscriptions")
	evalUntil(t, bctx, 10*time.Second, "the page again, with the kept token", `!!document.querySelector('#subscriptions tr.subscription[data-name="team-a-hook"]')`)
	if strings.Contains(evalString(t, bctx, `document.documentElement.outerHTML`), secret) {
		t.Errorf("the secret is in the page after a reload")
	}
	var shown map[string]any
	api(t, "GET", g.admin, "/api/v1/subscriptions/team-a-hook", teamA, &shown)
	if _, ok := shown["secret"]; ok || shown["status"] != "active" {
		t.Errorf("the API shows %v", shown)
	}

	// Pause.
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#subscriptions tr[data-name="team-a-hook"] button[data-action="sub-pause"]`))); err != nil {
		t.Fatalf("browser: pause: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "paused", `document.getElementById('flash').textContent === 'Paused team-a-hook.' && !!document.querySelector('#subscriptions tr[data-name="team-a-hook"][data-status="paused"] button[data-action="sub-resume"]')`)
	api(t, "GET", g.admin, "/api/v1/subscriptions/team-a-hook", teamA, &shown)
	if shown["status"] != "paused" {
		t.Errorf("status %v after the pause, want paused", shown["status"])
	}

	// Rotate: another secret, shown once.
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#subscriptions tr[data-name="team-a-hook"] button[data-action="sub-rotate"]`))); err != nil {
		t.Fatalf("browser: rotate: %v", err)
	}
	evalUntil(t, bctx, 10*time.Second, "the rotated secret", `!!document.getElementById('secret-value') && document.getElementById('secret-value').textContent.indexOf('whsec_') === 0 && document.getElementById('secret-value').textContent !== '`+secret+`' && document.getElementById('flash').textContent === 'Rotated the secret of team-a-hook.'`)
	evalUntil(t, bctx, 10*time.Second, "two signing secrets listed", `document.querySelectorAll('#subscriptions tr[data-name="team-a-hook"] td:nth-child(8) div').length === 2`)
	shot(t, bctx, artifacts, "console-subscription-rotated.png")
	if alerts := evalString(t, bctx, `JSON.stringify(window.__alerts)`); alerts != "[]" {
		t.Errorf("alert was called: %s", alerts)
	}
}

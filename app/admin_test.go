package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/test/mongotest"
)

// newEnvAt is newEnv on the MongoDB at uri.
func newEnvAt(t *testing.T, uri string) (*env, *deadletter.Store) {
	t.Helper()
	client := mongotest.Client(t, uri)
	e := &env{t: t, uri: uri, db: mongotest.UniqueName("cgapp_"), state: mongotest.UniqueName("cgappstate_")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Database(e.db).Drop(ctx)
		_ = client.Database(e.state).Drop(ctx)
	})
	e.cps = checkpoint.NewStore(client.Database(e.state), "checkpoints")
	e.insert = func() error { return nil }
	return e, deadletter.NewStore(client.Database(e.state), "deadletters")
}

// call makes an admin API request and returns the status and body.
func call(t *testing.T, method, addr, path, token string, hdr ...string) (int, []byte) {
	t.Helper()
	resp, b := do(t, method, addr, path, token, nil, hdr...)
	return resp.StatusCode, b
}

// do makes a request with the bearer token (when set) and the headers hdr
// (name, value pairs; "Host" sets the request's host) and returns the
// response, its body read.
func do(t *testing.T, method, addr, path, token string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

type listPage struct {
	Entries []deadletter.Entry `json:"entries"`
	Next    string             `json:"next"`
	Error   string             `json:"error"`
}

// TestListDeadLettersBoundedMemory: listing 50 dead letters of 10 MB each,
// six requests at once, keeps the heap under 64 MB (the listing reads
// summaries only, streams them, and caps limit); one entry's payload is a
// separate call.
func TestListDeadLettersBoundedMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("heap bounds are not measured under the race detector (it inflates allocations, and storing 500 MB takes a minute)")
	}
	e, dls := newEnvAt(t, outOfProcessURI(t))
	ctx := context.Background()
	if err := dls.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, 10<<20)
	for i := range 50 {
		change, err := bson.Marshal(bson.D{{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("%04d", i)}}}, {Key: "blob", Value: blob}})
		if err != nil {
			t.Fatal(err)
		}
		key, _ := bson.Marshal(bson.D{{Key: "_id", Value: i}})
		if err := dls.Put(ctx, deadletter.Entry{
			Kind: deadletter.KindFailed, EventID: fmt.Sprintf("items:%04d", i), Source: "items", Sink: "hook",
			Namespace: e.db + ".items", DocumentKey: key, Change: change, LastError: "http 400",
		}); err != nil {
			t.Fatal(err)
		}
	}
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	t.Logf("stored 50 entries")
	g := start(t, e.config(hook.URL, "5s"), app.Options{})

	runtime.GC()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	for _, q := range []string{"", "?limit=1000", "?limit=1000", "?sink=hook&limit=1000", "?limit=25", "?kind=failed"} {
		wg.Go(func() {
			code, body := call(t, "GET", g.admin, "/api/v1/deadletters"+q, "s3cret-admin-token")
			var p listPage
			if err := json.Unmarshal(body, &p); err != nil || code != 200 {
				t.Errorf("list%s: %d %v %.200s", q, code, err, body)
				return
			}
			want := 50
			if q == "?limit=25" {
				want = 25
			}
			if len(p.Entries) != want || p.Error != "" {
				t.Errorf("list%s: %d entries (error %q), want %d", q, len(p.Entries), p.Error, want)
			}
			for _, en := range p.Entries {
				if en.Change != nil || en.Envelope != nil || en.DocumentKey == nil {
					t.Errorf("list%s: entry %s carries its change or lacks its key", q, en.ID)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	if p := peak.Load(); p > 64<<20 {
		t.Errorf("heap reached %d MB while listing, want < 64 MB", p>>20)
	}

	// One entry in full is a separate call; an unknown one is 404.
	id := deadletter.EntryID("items:0007", "hook")
	code, body := call(t, "GET", g.admin, "/api/v1/deadletters/"+url.PathEscape(id), "s3cret-admin-token")
	var full deadletter.Entry
	if err := json.Unmarshal(body, &full); err != nil || code != 200 || full.ID != id || len(full.Change) < 10<<20 {
		t.Fatalf("show %s: %d %v, change %d bytes", id, code, err, len(full.Change))
	}
	if code, _ := call(t, "GET", g.admin, "/api/v1/deadletters/nope/hook", "s3cret-admin-token"); code != http.StatusNotFound {
		t.Fatalf("show of a missing entry: %d, want 404", code)
	}

	// limit is capped, and paging continues a capped listing.
	for _, q := range []string{"limit=0", "limit=1001", "limit=-1", "limit=x"} {
		if code, body := call(t, "GET", g.admin, "/api/v1/deadletters?"+q, "s3cret-admin-token"); code != http.StatusBadRequest {
			t.Errorf("list?%s: %d %s, want 400", q, code, body)
		}
	}
	var p listPage
	_, body = call(t, "GET", g.admin, "/api/v1/deadletters?limit=30", "s3cret-admin-token")
	if err := json.Unmarshal(body, &p); err != nil || len(p.Entries) != 30 || p.Next == "" {
		t.Fatalf("first page: %v %d entries next %q", err, len(p.Entries), p.Next)
	}
	_, body = call(t, "GET", g.admin, "/api/v1/deadletters?limit=30&after="+url.QueryEscape(p.Next), "s3cret-admin-token")
	p = listPage{}
	if err := json.Unmarshal(body, &p); err != nil || len(p.Entries) != 20 || p.Next != "" {
		t.Fatalf("second page: %v %d entries next %q", err, len(p.Entries), p.Next)
	}
	if code, _ := call(t, "GET", g.admin, "/api/v1/deadletters?after=gone", "s3cret-admin-token"); code != http.StatusNotFound {
		t.Fatalf("paging after a missing entry: %d, want 404", code)
	}
}

// TestAdminAccess: /healthz, /metrics and the /readyz verdict are open;
// status details and dead letters need the token (scheme matched
// case-insensitively) unless server.public_read; a Host header naming
// another site (DNS rebinding) is refused on every endpoint; bodies are
// bounded; an operator in document_key is refused.
func TestAdminAccess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	g := start(t, e.config(hook.URL, "5s"), app.Options{})
	hostname, _ := os.Hostname()

	type req struct {
		method, path, token string
		hdr                 []string
		want                int
	}
	for _, r := range []req{
		{"GET", "/healthz", "", nil, 200},
		{"GET", "/metrics", "", nil, 200},
		{"GET", "/readyz", "", nil, 200},
		{"GET", "/api/v1/status", "", nil, 401},
		{"GET", "/api/v1/status", "wrong", nil, 401},
		{"GET", "/api/v1/deadletters", "", nil, 401},
		{"GET", "/api/v1/deadletters/x/hook", "", nil, 401},
		{"GET", "/api/v1/status", "s3cret-admin-token", nil, 200},
		{"GET", "/api/v1/status", "", []string{"Authorization", "bearer s3cret-admin-token"}, 200},
		{"GET", "/api/v1/status", "", []string{"Authorization", "BEARER   s3cret-admin-token"}, 200},
		{"GET", "/api/v1/status", "", []string{"Authorization", "Basic s3cret-admin-token"}, 401},
		{"GET", "/api/v1/deadletters", "s3cret-admin-token", nil, 200},
		// DNS rebinding: a page on evil.example resolved to this address.
		{"GET", "/api/v1/status", "s3cret-admin-token", []string{"Host", "evil.example:9464"}, 421},
		{"GET", "/metrics", "", []string{"Host", "evil.example"}, 421},
		{"GET", "/readyz", "", []string{"Host", "EVIL.example."}, 421},
		{"GET", "/api/v1/status", "s3cret-admin-token", []string{"Host", "localhost:9464"}, 200},
		{"GET", "/api/v1/status", "s3cret-admin-token", []string{"Host", "LocalHost."}, 200},
		{"GET", "/api/v1/status", "s3cret-admin-token", []string{"Host", "10.1.2.3:9464"}, 200},
		{"GET", "/api/v1/status", "s3cret-admin-token", []string{"Host", "[::1]:9464"}, 200},
		{"GET", "/api/v1/status", "s3cret-admin-token", []string{"Host", hostname}, 200},
		// Operators in document_key are refused, for reads and purges alike.
		{"GET", "/api/v1/deadletters?document_key=" + url.QueryEscape(`{"_id":{"$ne":null}}`), "s3cret-admin-token", nil, 400},
		{"DELETE", "/api/v1/deadletters?document_key=" + url.QueryEscape(`{"_id":{"$regex":"."}}`), "s3cret-admin-token", nil, 400},
	} {
		if code, body := call(t, r.method, g.admin, r.path, r.token, r.hdr...); code != r.want {
			t.Errorf("%s %s (token %q, %q): %d %s, want %d", r.method, r.path, r.token, r.hdr, code, body, r.want)
		}
	}

	// Replies carrying data are neither cached nor sniffed, refusals
	// included.
	for _, r := range []struct{ method, path, token string }{
		{"GET", "/api/v1/status", "s3cret-admin-token"},
		{"GET", "/api/v1/deadletters", "s3cret-admin-token"},
		{"GET", "/api/v1/deadletters/x/hook", "s3cret-admin-token"},
		{"GET", "/api/v1/deadletters", ""},
		{"GET", "/api/v1/backfills", "s3cret-admin-token"},
		{"GET", "/readyz", "s3cret-admin-token"},
	} {
		resp, body := do(t, r.method, g.admin, r.path, r.token, nil)
		if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s %s (token %q): %d %s: Cache-Control %q, X-Content-Type-Options %q, want no-store and nosniff",
				r.method, r.path, r.token, resp.StatusCode, body, resp.Header.Get("Cache-Control"), resp.Header.Get("X-Content-Type-Options"))
		}
	}

	// The open /readyz gives the verdict, not the details.
	_, open := call(t, "GET", g.admin, "/readyz", "")
	_, full := call(t, "GET", g.admin, "/readyz", "s3cret-admin-token")
	if strings.Contains(string(open), "checkpointToken") || !strings.Contains(string(open), `"ready": true`) {
		t.Errorf("open /readyz shows details: %s", open)
	}
	if !strings.Contains(string(full), "checkpointToken") {
		t.Errorf("/readyz with the token lacks details: %s", full)
	}
	// The byte budget: here no container limit, so the 256 MiB default.
	_, st := call(t, "GET", g.admin, "/api/v1/status", "s3cret-admin-token")
	var status struct {
		Memory struct {
			InflightBytes *int64 `json:"inflightBytes"`
			BudgetBytes   int64  `json:"budgetBytes"`
			BudgetFrom    string `json:"budgetFrom"`
		} `json:"memory"`
	}
	if err := json.Unmarshal(st, &status); err != nil || status.Memory.InflightBytes == nil || status.Memory.BudgetBytes <= 0 || status.Memory.BudgetFrom == "" {
		t.Errorf("/api/v1/status lacks the byte budget (%v): %s", err, st)
	}
	if _, metricsBody := call(t, "GET", g.admin, "/metrics", ""); !strings.Contains(string(metricsBody), "changegate_inflight_bytes_budget ") || !strings.Contains(string(metricsBody), "changegate_inflight_bytes ") {
		t.Errorf("/metrics lacks changegate_inflight_bytes and its budget")
	}

	// Bodies are bounded.
	big, _ := http.NewRequest("POST", "http://"+g.admin+"/api/v1/reload", strings.NewReader(strings.Repeat("x", 1<<20)))
	big.Header.Set("Authorization", "Bearer s3cret-admin-token")
	if resp, err := http.DefaultClient.Do(big); err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("1 MiB body: %v %v, want 413", resp, err)
	} else {
		resp.Body.Close()
	}
}

// TestAdminPublicRead: server.public_read serves data without a token,
// server.allowed_hosts replaces the default names, and without a token
// configured data reads are refused (403) rather than open.
func TestAdminPublicRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	cfg := e.config(hook.URL, "5s")
	cfg.Server.PublicRead = true
	cfg.Server.AllowedHosts = []string{"changegate.example"}
	g := start(t, cfg, app.Options{})
	for _, r := range []struct {
		host string
		want int
	}{{"", 200}, {"changegate.example:9464", 200}, {"other.example", 421}} {
		var hdr []string
		if r.host != "" {
			hdr = []string{"Host", r.host}
		}
		if code, body := call(t, "GET", g.admin, "/api/v1/status", "", hdr...); code != r.want {
			t.Errorf("public status, Host %q: %d %s, want %d", r.host, code, body, r.want)
		}
	}
	if code, _ := call(t, "POST", g.admin, "/api/v1/reload", ""); code != http.StatusUnauthorized {
		t.Errorf("reload without token under public_read: %d, want 401", code)
	}
	g.stop(t, 10*time.Second)

	cfg = e.config(hook.URL, "5s")
	cfg.Server.AdminToken = ""
	g = start(t, cfg, app.Options{})
	if code, body := call(t, "GET", g.admin, "/api/v1/deadletters", ""); code != http.StatusForbidden || !strings.Contains(string(body), "server.public_read") {
		t.Errorf("list without a configured token: %d %s, want 403 naming server.public_read", code, body)
	}
}

// TestPathSecretHidden: a webhook URL with a secret in its path (Slack- or
// Discord-style) appears in no log, no /api/v1/status lastError and no dead
// letter: they show the scheme, the host and a fingerprint of the path.
func TestPathSecretHidden(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	t.Cleanup(hook.Close)
	const secret = "T0001/B0002/pathSECRETtoken"
	cfg := e.config(hook.URL+"/services/"+secret, "5s")
	cfg.Sinks[0].Retry.MaxAttempts, cfg.Sinks[0].Retry.InitialInterval = 4, 300*time.Millisecond
	g := start(t, cfg, app.Options{})
	if err := e.insert(); err != nil {
		t.Fatal(err)
	}
	var p listPage
	var status []byte
	waitFor(t, 15*time.Second, "the sink's lastError in the status", func() bool {
		_, status = call(t, "GET", g.admin, "/api/v1/status", "s3cret-admin-token")
		return strings.Contains(string(status), `"lastError"`)
	})
	waitFor(t, 15*time.Second, "a dead letter", func() bool {
		_, body := call(t, "GET", g.admin, "/api/v1/deadletters", "s3cret-admin-token")
		p = listPage{}
		return json.Unmarshal(body, &p) == nil && len(p.Entries) == 1
	})
	_, full := call(t, "GET", g.admin, "/api/v1/deadletters/"+url.PathEscape(p.Entries[0].ID), "s3cret-admin-token")
	for what, text := range map[string]string{"status": string(status), "dead letter": string(full), "logs": g.log.text()} {
		if strings.Contains(text, "SECRET") {
			t.Errorf("%s shows the URL path: %s", what, text)
		}
	}
	if !strings.Contains(string(status), "path sha256:") || !strings.Contains(p.Entries[0].LastError, "/[path sha256:") {
		t.Errorf("status or dead letter lacks the fingerprinted URL: %s / %s", status, p.Entries[0].LastError)
	}
}

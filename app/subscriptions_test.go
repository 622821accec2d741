package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/receive"
	"github.com/changegate/changegate/subscription"
	"github.com/changegate/changegate/test/mongotest"
)

// testSubscriptionKey is the key of the tests' [subscriptions].
const testSubscriptionKey = config.Secret("kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk")

// subscriptionsOn is the tests' [subscriptions]: enabled with
// testSubscriptionKey, at most 10, local (private) targets allowed.
func subscriptionsOn() config.Subscriptions {
	return config.Subscriptions{Enabled: true, Key: testSubscriptionKey, MaxSubscriptions: 10, AllowPrivateNetworks: true}
}

// docReceiver records the documentKey _id of every event it receives, and
// the signature headers.
type docReceiver struct {
	mu   sync.Mutex
	ids  []int
	reqs []http.Header
	body [][]byte
	srv  *httptest.Server
	// fail makes it answer 500, recording nothing.
	fail atomic.Bool
}

func newDocReceiver(t *testing.T) *docReceiver {
	r := &docReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if r.fail.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		var ev struct {
			DocumentKey struct {
				ID int `json:"_id"`
			} `json:"documentKey"`
		}
		_ = json.Unmarshal(body, &ev)
		r.mu.Lock()
		r.ids = append(r.ids, ev.DocumentKey.ID)
		r.reqs = append(r.reqs, req.Header.Clone())
		r.body = append(r.body, body)
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *docReceiver) got() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids)
}

// sinkParked reads the sink's parked flag from /api/v1/status.
func sinkParked(t *testing.T, admin, sink string) (parked, found bool) {
	req, _ := http.NewRequest("GET", "http://"+admin+"/api/v1/status", nil)
	req.Header.Set("Authorization", "Bearer s3cret-admin-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, false
	}
	defer resp.Body.Close()
	var st struct {
		Sinks []struct {
			Name   string `json:"name"`
			Parked bool   `json:"parked"`
		} `json:"sinks"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	for _, s := range st.Sinks {
		if s.Name == sink {
			return s.Parked, true
		}
	}
	return false, false
}

// TestRunAppliesStoredSubscriptions: a subscription stored while the
// gateway runs is applied within 2 s (its sink receives the next changes,
// signed with its secret); paused, it receives nothing while changes are
// written, and resumed, all of them in order; rotated, both secrets verify;
// deleted, nothing more arrives. The file's sink receives every change
// exactly once throughout (one document each: their order may differ).
func TestRunAppliesStoredSubscriptions(t *testing.T) {
	e := newEnv(t)
	hook := newDocReceiver(t)
	sub := newDocReceiver(t)
	cfg := e.config(hook.srv.URL, "5s")
	cfg.Subscriptions = subscriptionsOn()
	g := start(t, cfg, app.Options{})

	client := mongotest.Client(t, e.uri)
	sealer, err := subscription.NewSealer([]byte(testSubscriptionKey))
	if err != nil {
		t.Fatal(err)
	}
	store := subscription.NewStore(client.Database(e.state), subscription.Options{Sealer: sealer, Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	n := 0
	insert := func(k int) {
		t.Helper()
		for range k {
			if err := e.insert(); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	insert(2)
	waitFor(t, 10*time.Second, "the file's sink receives the first changes", func() bool { return len(hook.got()) == 2 })

	body := fmt.Sprintf(`{"name":"team-a-items","source":"items","sink":{"type":"webhook","url":%q}}`, sub.srv.URL)
	v := &subscription.Validator{Config: cfg}
	_, spec, problems := v.Validate(ctx, []byte(body))
	if problems != nil {
		t.Fatal(problems)
	}
	created, secret, err := store.Create(ctx, "team-a", "team-a-items", spec, 10)
	if err != nil {
		t.Fatal(err)
	}
	appliedAt := time.Now()
	waitFor(t, 2*time.Second, "the subscription applied", func() bool { _, ok := sinkParked(t, g.admin, "team-a-items"); return ok })
	t.Logf("applied %v after the create", time.Since(appliedAt).Round(time.Millisecond))
	insert(1)
	waitFor(t, 10*time.Second, "the subscription receives the next change", func() bool { return slices.Equal(sub.got(), []int{3}) })
	// Applied held while it caught up, then released: live once its
	// re-drive is done (parked would not tell the pause below).
	waitFor(t, 10*time.Second, "the subscription live", func() bool { p, ok := sinkParked(t, g.admin, "team-a-items"); return ok && !p })
	verifier, err := receive.NewVerifier(secret.Value())
	if err != nil {
		t.Fatal(err)
	}
	sub.mu.Lock()
	req0, body0 := sub.reqs[0], sub.body[0]
	sub.mu.Unlock()
	if _, err := verifier.Verify(req0, body0); err != nil {
		t.Errorf("the subscription's request does not verify with its secret: %v", err)
	}

	if _, err := store.SetStatus(ctx, "team-a", "team-a-items", created.Revision, subscription.StatusPaused, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the pause applied", func() bool { p, _ := sinkParked(t, g.admin, "team-a-items"); return p })
	insert(3)
	waitFor(t, 10*time.Second, "the file's sink receives the changes written during the pause", func() bool { return len(hook.got()) == 6 })
	time.Sleep(300 * time.Millisecond)
	if got := sub.got(); !slices.Equal(got, []int{3}) {
		t.Fatalf("a paused subscription received %v", got)
	}
	if _, err := store.SetStatus(ctx, "team-a", "team-a-items", 0, subscription.StatusActive, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the resumed subscription receives what was written during the pause", func() bool { return len(sub.got()) == 4 })
	// Different documents: each one's changes in order, not across them.
	if got := sub.got(); got[0] != 3 || !slices.Equal(slices.Sorted(slices.Values(got)), []int{3, 4, 5, 6}) {
		t.Errorf("after the resume: %v, want 3, then 4, 5 and 6", got)
	}

	_, second, err := store.RotateSecret(ctx, "team-a", "team-a-items", 0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The rotation is applied by the next poll; a change after it is
	// signed with both secrets.
	time.Sleep(2 * time.Second)
	insert(1)
	waitFor(t, 10*time.Second, "a change after the rotation", func() bool { return len(sub.got()) == 5 })
	sub.mu.Lock()
	req, b := sub.reqs[4], sub.body[4]
	sub.mu.Unlock()
	for _, s := range []config.Secret{secret, second} {
		vf, _ := receive.NewVerifier(s.Value())
		if _, err := vf.Verify(req, b); err != nil {
			t.Errorf("during the overlap a receiver with one of the secrets fails: %v", err)
		}
	}

	if _, err := store.Delete(ctx, "team-a", "team-a-items", 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the delete applied", func() bool { _, ok := sinkParked(t, g.admin, "team-a-items"); return !ok })
	insert(2)
	waitFor(t, 10*time.Second, "the file's sink receives everything", func() bool { return len(hook.got()) == n })
	time.Sleep(300 * time.Millisecond)
	if got := sub.got(); len(got) != 5 {
		t.Errorf("a deleted subscription received %v", got)
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i + 1
	}
	if got := hook.got(); !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		t.Errorf("the file's sink received %v, want each change once: %v", got, want)
	}
	if err := g.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// apiCall sends a request to the admin server with token and returns the
// status and the decoded JSON body.
func apiCall(t *testing.T, admin, method, path, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestSubscriptionsAPI: the routes of /api/v1/subscriptions, with a token
// scoped to team-a- and the admin token.
func TestSubscriptionsAPI(t *testing.T) {
	e := newEnv(t)
	hook := newDocReceiver(t)
	sub := newDocReceiver(t)
	cfg := e.config(hook.srv.URL, "5s")
	cfg.Subscriptions = config.Subscriptions{Enabled: true, Key: testSubscriptionKey, MaxSubscriptions: 2}
	cfg.Server.Tokens = []config.Token{{Name: "team-a", Token: "team-a-token-0123456789", Prefix: "team-a-"}}
	g := start(t, cfg, app.Options{})
	const a, admin = "team-a-token-0123456789", "s3cret-admin-token"
	body := func(name, url string) string {
		return fmt.Sprintf(`{"name":%q,"source":"items","sink":{"type":"webhook","url":%q}}`, name, url)
	}

	// Bad requests: 400 with the JSON path of each problem.
	code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions", a, `{"name":"team-a-x","source":"items","sink":{"type":"webhook","url":"`+sub.srv.URL+`"},"colour":"red"}`)
	if code != 400 || fmt.Sprint(out["problems"]) != `[$.colour: unknown field]` {
		t.Errorf("unknown field: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions", a, body("team-a-x", sub.srv.URL))
	if code != 400 || fmt.Sprint(out["problems"]) != `[$.sink.url: refused: 127.0.0.1 is a loopback address; private, loopback and link-local targets need [subscriptions] allow_private_networks in the operator's configuration]` {
		t.Errorf("loopback target: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions", a, `{"name":"team-a-x","source":"items","filter":{"fullDocument.n":{"$bad":1}},"sink":{"type":"webhook","url":"https://a.example.com/"}}`)
	if code != 400 || !strings.HasPrefix(fmt.Sprint(out["problems"]), `[$.filter: invalid filter: unknown operator $bad`) {
		t.Errorf("bad filter: %d %v", code, out)
	}
	code, _ = apiCall(t, g.admin, "POST", "/api/v1/subscriptions", a, `{"name":"`+strings.Repeat("x", 70<<10)+`"}`)
	if code != 413 {
		t.Errorf("oversized body: %d, want 413", code)
	}
	code, _ = apiCall(t, g.admin, "POST", "/api/v1/subscriptions", "", body("team-a-x", "https://a.example.com/"))
	if code != 401 {
		t.Errorf("no token: %d, want 401", code)
	}
	// Scopes: team-a's token may not touch team-b's names.
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions", a, body("team-b-x", "https://b.example.com/"))
	if code != 403 {
		t.Errorf("team-a creating team-b-x: %d %v, want 403", code, out)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions", a, body("team-a-x", "https://a.example.com/"))
	secret, _ := out["secret"].(string)
	if code != 201 || !strings.HasPrefix(secret, "whsec_") || out["status"] != "active" || out["revision"] != float64(1) {
		t.Fatalf("create: %d %v", code, out)
	}
	code, _ = apiCall(t, g.admin, "POST", "/api/v1/subscriptions", a, body("team-a-x", "https://a.example.com/"))
	if code != 409 {
		t.Errorf("duplicate: %d, want 409", code)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions", admin, body("team-b-x", "https://b.example.com/"))
	if code != 201 {
		t.Fatalf("admin creating team-b-x: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions", admin, body("team-b-y", "https://b.example.com/"))
	if code != 409 || !strings.Contains(fmt.Sprint(out["error"]), "max_subscriptions") {
		t.Errorf("past max_subscriptions: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "GET", "/api/v1/subscriptions/team-b-x", a, "")
	if code != 403 {
		t.Errorf("team-a reading team-b-x: %d %v", code, out)
	}
	for _, p := range []string{"/pause", "/resume", "/rotate-secret", ""} {
		method := "POST"
		if p == "" {
			method = "DELETE"
		}
		if code, _ := apiCall(t, g.admin, method, "/api/v1/subscriptions/team-b-x"+p, a, ""); code != 403 {
			t.Errorf("team-a %s team-b-x%s: %d, want 403", method, p, code)
		}
	}
	code, out = apiCall(t, g.admin, "GET", "/api/v1/subscriptions", a, "")
	if list, _ := out["subscriptions"].([]any); code != 200 || len(list) != 1 || list[0].(map[string]any)["name"] != "team-a-x" {
		t.Errorf("team-a's list: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "GET", "/api/v1/subscriptions?limit=1", admin, "")
	if list, _ := out["subscriptions"].([]any); code != 200 || len(list) != 1 || out["next"] == nil {
		t.Errorf("admin's first page: %d %v", code, out)
	}

	// PATCH merges, keeps the name, needs the revision it read.
	code, out = apiCall(t, g.admin, "PATCH", "/api/v1/subscriptions/team-a-x", a, `{"envelope":"key","sink":{"batch_size":5}}`)
	if code != 200 || out["envelope"] != "key" || out["revision"] != float64(2) || out["sink"].(map[string]any)["url"] != "https://a.example.com/" {
		t.Errorf("patch: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "PATCH", "/api/v1/subscriptions/team-a-x", a, `{"name":"team-a-y"}`)
	if code != 400 || fmt.Sprint(out["problems"]) != `[$.name: a subscription's name cannot change: create another]` {
		t.Errorf("renaming patch: %d %v", code, out)
	}
	req, _ := http.NewRequest("PATCH", "http://"+g.admin+"/api/v1/subscriptions/team-a-x", strings.NewReader(`{"envelope":"full"}`))
	req.Header.Set("Authorization", "Bearer "+a)
	req.Header.Set("If-Match", `"1"`)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 409 {
		t.Errorf("patch of an old revision: %v %v, want 409", resp.StatusCode, err)
	}

	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions/team-a-x/pause", a, `{"reason":"maintenance"}`)
	if code != 200 || out["status"] != "paused" || out["reason"] != "maintenance" {
		t.Errorf("pause: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions/team-a-x/resume", a, "")
	if code != 200 || out["status"] != "active" {
		t.Errorf("resume: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions/team-a-x/rotate-secret", a, `{"overlap":"1h"}`)
	rotated, _ := out["secret"].(string)
	if code != 200 || !strings.HasPrefix(rotated, "whsec_") || rotated == secret || len(out["signing_secrets"].([]any)) != 2 {
		t.Errorf("rotate: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "GET", "/api/v1/subscriptions/team-a-x", a, "")
	if code != 200 || out["secret"] != nil || strings.Contains(fmt.Sprint(out), strings.TrimPrefix(rotated, "whsec_")) {
		t.Errorf("show: %d %v", code, out)
	}
	code, out = apiCall(t, g.admin, "DELETE", "/api/v1/subscriptions/team-a-x", a, "")
	if code != 200 || out["deleted"] != "team-a-x" {
		t.Errorf("delete: %d %v", code, out)
	}
	if code, _ := apiCall(t, g.admin, "GET", "/api/v1/subscriptions/team-a-x", a, ""); code != 404 {
		t.Errorf("after delete: %d, want 404", code)
	}
	if err := g.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestSubscriptionTest: POST /api/v1/subscriptions/test tries a
// subscription on a sample change and on the source's last changes,
// answering which match and the body the webhook would post, shaped,
// storing nothing; a bad body gets the problems a create gets, a scoped
// token may try only its own names.
func TestSubscriptionTest(t *testing.T) {
	e := newEnv(t)
	hook := newDocReceiver(t)
	cfg := e.config(hook.srv.URL, "5s")
	cfg.Subscriptions = config.Subscriptions{Enabled: true, Key: testSubscriptionKey, MaxSubscriptions: 10}
	cfg.Server.Tokens = []config.Token{{Name: "team-a", Token: "team-a-token-0123456789", Prefix: "team-a-"}}
	g := start(t, cfg, app.Options{})
	const a = "team-a-token-0123456789"
	for range 3 {
		if err := e.insert(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the file's sink receives the changes", func() bool { return len(hook.got()) == 3 })

	spec := `"name":"team-a-t","source":"items","filter":{"fullDocument._id":{"$gte":2}},"redact":["fullDocument.ssn"],"sink":{"type":"webhook","url":"https://a.example.com/"}`
	code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions/test", a, `{`+spec+`,"last":10}`)
	results, _ := out["results"].([]any)
	if code != 200 || len(results) != 3 || out["note"] == nil {
		t.Fatalf("last 10: %d %v", code, out)
	}
	for i, r := range results {
		r := r.(map[string]any)
		want := i >= 1 // documents 2 and 3
		if r["matches"] != want {
			t.Errorf("change %d: matches %v, want %v (%v)", i+1, r["matches"], want, r)
		}
		body, _ := r["body"].(map[string]any)
		if want != (body != nil) {
			t.Errorf("change %d: body %v", i+1, r["body"])
		}
		if body != nil && (body["id"] != r["id"] || body["operationType"] != "insert" || fmt.Sprint(body["fullDocument"]) != fmt.Sprintf("map[_id:%d]", i+1)) {
			t.Errorf("change %d: body %v", i+1, body)
		}
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions/test", a, `{`+spec+`,"last":2}`)
	if results, _ := out["results"].([]any); code != 200 || len(results) != 2 || out["note"] != nil {
		t.Errorf("last 2: %d %v", code, out)
	}

	// A sample change: shaped as the subscription shapes it.
	change := `{"_id":{"_data":"8263"},"operationType":"insert","ns":{"db":"x","coll":"items"},"documentKey":{"_id":7},"fullDocument":{"_id":7,"ssn":"123-45"}}`
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions/test", a, `{`+spec+`,"change":`+change+`}`)
	results, _ = out["results"].([]any)
	if code != 200 || len(results) != 1 {
		t.Fatalf("change: %d %v", code, out)
	}
	r := results[0].(map[string]any)
	if body, _ := r["body"].(map[string]any); r["matches"] != true || fmt.Sprint(body["fullDocument"]) != "map[_id:7 ssn:[REDACTED]]" {
		t.Errorf("change: %v", r)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions/test", a, `{`+strings.Replace(spec, `"$gte":2`, `"$gte":8`, 1)+`,"change":`+change+`}`)
	if results, _ := out["results"].([]any); code != 200 || len(results) != 1 || results[0].(map[string]any)["matches"] != false || results[0].(map[string]any)["body"] != nil {
		t.Errorf("change not matching: %d %v", code, out)
	}

	// Problems as a create reports them, plus those of the test's members.
	for _, tc := range []struct{ body, problems string }{
		{`{` + spec + `,"colour":"red","last":1}`, `[$.colour: unknown field]`},
		{`{` + strings.Replace(spec, "https://a.example.com/", "http://127.0.0.1/", 1) + `,"last":1}`, `[$.sink.url: refused: 127.0.0.1 is a loopback address; private, loopback and link-local targets need [subscriptions] allow_private_networks in the operator's configuration]`},
		{`{` + spec + `}`, `[$: give "change" (a change event, Extended JSON) or "last" (how many of the source's last changes to try)]`},
		{`{` + spec + `,"last":0}`, `[$.last: want a whole number from 1 to 100]`},
		{`{` + spec + `,"last":1,"change":{}}`, `[$.last: give "change" or "last", not both]`},
		{`{` + spec + `,"change":[1]}`, `[$.change: want a change event as an object in Extended JSON (as changegate tail prints it): `},
	} {
		code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions/test", a, tc.body)
		if code != 400 || !strings.HasPrefix(fmt.Sprint(out["problems"]), strings.TrimSuffix(tc.problems, "]")) {
			t.Errorf("%s: %d %v, want 400 %s", tc.body, code, out, tc.problems)
		}
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions/test", a, `{`+strings.Replace(spec, "team-a-t", "team-b-t", 1)+`,"last":1}`)
	if code != 403 {
		t.Errorf("team-a trying team-b-t: %d %v, want 403", code, out)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions/test", "s3cret-admin-token", `{`+strings.Replace(spec, "team-a-t", "team-b-t", 1)+`,"last":1}`)
	if code != 200 {
		t.Errorf("admin trying team-b-t: %d %v", code, out)
	}
	// Nothing was stored.
	code, out = apiCall(t, g.admin, "GET", "/api/v1/subscriptions", "s3cret-admin-token", "")
	subs, _ := out["subscriptions"].([]any)
	if code != 200 || slices.ContainsFunc(subs, func(s any) bool { return s.(map[string]any)["managed_by"] != "config" }) {
		t.Errorf("stored after tests: %d %v", code, out)
	}
}

// TestSubscriptionDisableAfter: a subscription whose endpoint keeps failing
// for disable_after is disabled by changegate (through the store, audited
// as "changegate", the reason shown), its events written meanwhile are kept,
// and on resume they are delivered, each once.
func TestSubscriptionDisableAfter(t *testing.T) {
	e := newEnv(t)
	hook := newDocReceiver(t)
	sub := newDocReceiver(t)
	sub.fail.Store(true)
	cfg := e.config(hook.srv.URL, "5s")
	cfg.Subscriptions = subscriptionsOn()
	g := start(t, cfg, app.Options{})
	const admin = "s3cret-admin-token"
	code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions", admin,
		fmt.Sprintf(`{"name":"team-a-d","source":"items","disable_after":"1s","sink":{"type":"webhook","url":%q}}`, sub.srv.URL))
	if code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	waitFor(t, 5*time.Second, "the subscription applied", func() bool { _, ok := sinkParked(t, g.admin, "team-a-d"); return ok })
	if err := e.insert(); err != nil {
		t.Fatal(err)
	}
	var shown map[string]any
	waitFor(t, 15*time.Second, "the subscription disabled", func() bool {
		_, shown = apiCall(t, g.admin, "GET", "/api/v1/subscriptions/team-a-d", admin, "")
		return shown["status"] == "disabled"
	})
	if r, _ := shown["reason"].(string); !strings.Contains(r, "disable_after: its endpoint has failed without a success for 1s") || !strings.Contains(r, "500") {
		t.Errorf("reason %q", shown["reason"])
	}
	client := mongotest.Client(t, e.uri)
	store := subscription.NewStore(client.Database(e.state), subscription.Options{Log: slog.New(slog.DiscardHandler)})
	audit, err := store.Audit(context.Background(), "team-a-d", 10)
	if err != nil || len(audit) == 0 || audit[0].Actor != app.SystemActor || audit[0].Action != subscription.ActionDisable {
		t.Fatalf("audit: %v %v", audit, err)
	}
	// Once every replica applied the status (within a poll; here its sink
	// is parked), what is written is kept, not delivered, though the
	// endpoint answers again.
	sub.fail.Store(false)
	waitFor(t, 15*time.Second, "the disabled subscription's sink parked", func() bool { p, _ := sinkParked(t, g.admin, "team-a-d"); return p })
	for range 3 {
		if err := e.insert(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the file's sink receives every change", func() bool { return len(hook.got()) == 4 })
	if got := sub.got(); slices.ContainsFunc(got, func(id int) bool { return id > 1 }) {
		t.Fatalf("delivered while disabled: %v", got)
	}
	code, out = apiCall(t, g.admin, "POST", "/api/v1/subscriptions/team-a-d/resume", admin, "")
	if code != 200 || out["status"] != "active" || out["reason"] != nil {
		t.Fatalf("resume: %d %v", code, out)
	}
	// Each change is of its own document: per-document order is the
	// held lane's re-drive's (router TestHeldSinkParksUntilReleased).
	waitFor(t, 15*time.Second, "the kept changes delivered on resume", func() bool {
		return slices.Equal(slices.Sorted(slices.Values(sub.got())), []int{1, 2, 3, 4})
	})
}

// TestSubscriptionNotices: with [subscriptions] events_sink, the events
// sink receives delivery.exhausted for an event the subscription
// dead-lettered (its document key, never its payload), then
// subscription.disabled when disable_after disabled it, then
// subscription.recovered when it is resumed; a pause by its owner is not
// notified, and the file's sink gets no notice.
func TestSubscriptionNotices(t *testing.T) {
	e := newEnv(t)
	hook := newDocReceiver(t)
	var (
		mu      sync.Mutex
		notices []subscription.Notice
		raw     [][]byte
	)
	ops := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var n subscription.Notice
		if err := json.Unmarshal(body, &n); err != nil {
			t.Errorf("a notice that is not one: %s", body)
		}
		mu.Lock()
		notices, raw = append(notices, n), append(raw, body)
		mu.Unlock()
	}))
	t.Cleanup(ops.Close)
	// The subscription's endpoint answers status: 400 (the change is
	// dead-lettered at once), then 500 (failing: disable_after), then 200.
	var status atomic.Int64
	status.Store(http.StatusBadRequest)
	sub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(sub.Close)
	text := strings.NewReplacer("%URI%", e.uri, "%DB%", e.db, "%STATE%", e.state, "%URL%", hook.srv.URL, "%GRACE%", "5s").Replace(configText) + fmt.Sprintf(`
[[sinks]]
name = "ops"
type = "webhook"
url = %q
allow_private_networks = true

[subscriptions]
enabled = true
allow_private_networks = true
events_sink = "ops"
`, ops.URL)
	cfg, err := config.Parse("test.toml", []byte(text), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	cfg.Subscriptions.Key = testSubscriptionKey
	g := start(t, cfg, app.Options{})
	const admin = "s3cret-admin-token"
	got := func() []subscription.Notice {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(notices)
	}
	code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions", admin,
		fmt.Sprintf(`{"name":"team-a-n","source":"items","redact":["fullDocument.secret"],"disable_after":"2s","sink":{"type":"webhook","url":%q}}`, sub.URL))
	if code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	waitFor(t, 5*time.Second, "the subscription applied", func() bool { _, ok := sinkParked(t, g.admin, "team-a-n"); return ok })
	// The owner's own pause and resume of an active subscription: a
	// resume is notified (recovered from paused), the pause is not.
	if code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions/team-a-n/pause", admin, ""); code != 200 {
		t.Fatalf("pause: %d %v", code, out)
	}
	if code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions/team-a-n/resume", admin, ""); code != 200 {
		t.Fatalf("resume: %d %v", code, out)
	}
	waitFor(t, 5*time.Second, "the resume notified", func() bool { return len(got()) == 1 })
	if n := got()[0]; n.Type != subscription.NoticeRecovered || n.Data.PreviousStatus != subscription.StatusPaused || n.Data.Actor != "admin" {
		t.Fatalf("notice of a resume after a pause: %+v", n)
	}
	waitFor(t, 5*time.Second, "the subscription live again", func() bool { p, ok := sinkParked(t, g.admin, "team-a-n"); return ok && !p })
	if err := e.insert(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "delivery.exhausted", func() bool {
		return slices.ContainsFunc(got(), func(n subscription.Notice) bool { return n.Type == subscription.NoticeExhausted })
	})
	var ex subscription.Notice
	for _, n := range got() {
		if n.Type == subscription.NoticeExhausted {
			ex = n
		}
	}
	if ex.Data.Subscription != "team-a-n" || !strings.HasPrefix(ex.Data.EventID, "items:") || ex.Data.OperationType != "insert" ||
		ex.Data.Namespace != e.db+".items" || string(ex.Data.DocumentKey) != `{"_id":1}` || ex.Data.Attempts != 1 || ex.ID != subscription.NoticeExhausted+":team-a-n:"+ex.Data.EventID {
		t.Fatalf("delivery.exhausted: %+v (key %s)", ex, ex.Data.DocumentKey)
	}
	status.Store(http.StatusInternalServerError)
	if err := e.insert(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "subscription.disabled", func() bool {
		return slices.ContainsFunc(got(), func(n subscription.Notice) bool { return n.Type == subscription.NoticeDisabled })
	})
	status.Store(http.StatusOK)
	if code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions/team-a-n/resume", admin, ""); code != 200 {
		t.Fatalf("resume: %d %v", code, out)
	}
	waitFor(t, 5*time.Second, "subscription.recovered", func() bool {
		n := got()
		return len(n) > 0 && n[len(n)-1].Type == subscription.NoticeRecovered && n[len(n)-1].Data.PreviousStatus == subscription.StatusDisabled
	})
	for _, n := range got() {
		switch n.Type {
		case subscription.NoticeDisabled:
			if n.Data.Actor != app.SystemActor || !strings.Contains(n.Data.Reason, "disable_after") || n.Data.Status != subscription.StatusDisabled {
				t.Errorf("subscription.disabled: %+v", n)
			}
		case subscription.NoticeExhausted, subscription.NoticeRecovered:
		default:
			t.Errorf("unexpected notice %+v", n)
		}
	}
	mu.Lock()
	for _, b := range raw {
		if strings.Contains(string(b), "fullDocument") {
			t.Errorf("a notice with a payload: %s", b)
		}
	}
	mu.Unlock()
	if n := len(hook.got()); n != 2 {
		t.Errorf("the file's sink got %d events, want the two changes", n)
	}
}

// TestSubscriptionDeletePurgesAfterTheGrace: what a deleted subscription
// dead-lettered stays readable until the purge_at of the delete's answer
// (delete_grace), then it is removed; the file's sink's entries stay.
func TestSubscriptionDeletePurgesAfterTheGrace(t *testing.T) {
	e := newEnv(t)
	hook := newDocReceiver(t)
	hook.fail.Store(true) // the file's sink dead-letters too (2 attempts)
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, "no", http.StatusBadRequest)
	}))
	t.Cleanup(refuse.Close)
	cfg := e.config(hook.srv.URL, "5s")
	cfg.Subscriptions = subscriptionsOn()
	cfg.Subscriptions.DeleteGrace = 2 * time.Second
	g := start(t, cfg, app.Options{})
	const admin = "s3cret-admin-token"
	if code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions", admin,
		fmt.Sprintf(`{"name":"team-a-p","source":"items","sink":{"type":"webhook","url":%q}}`, refuse.URL)); code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	waitFor(t, 5*time.Second, "the subscription applied", func() bool { _, ok := sinkParked(t, g.admin, "team-a-p"); return ok })
	if err := e.insert(); err != nil {
		t.Fatal(err)
	}
	deadLetters := func(sink string) int {
		_, out := apiCall(t, g.admin, "GET", "/api/v1/deadletters?sink="+sink, admin, "")
		entries, _ := out["entries"].([]any)
		return len(entries)
	}
	waitFor(t, 10*time.Second, "both sinks dead-lettered the change", func() bool { return deadLetters("team-a-p") == 1 && deadLetters("hook") == 1 })
	code, out := apiCall(t, g.admin, "DELETE", "/api/v1/subscriptions/team-a-p", admin, "")
	at, err := time.Parse(time.RFC3339, fmt.Sprint(out["purge_at"]))
	if code != 200 || err != nil || !strings.Contains(fmt.Sprint(out["dead_letters"]), "until") {
		t.Fatalf("delete: %d %v", code, out)
	}
	if time.Until(at) > 3*time.Second {
		t.Fatalf("purge_at %v, want about 2 s from now", at)
	}
	if n := deadLetters("team-a-p"); n != 1 {
		t.Fatalf("%d dead letters right after the delete, want 1 (kept for the grace)", n)
	}
	waitFor(t, 10*time.Second, "the deleted subscription's dead letters removed", func() bool { return deadLetters("team-a-p") == 0 })
	if !time.Now().After(at) {
		t.Fatalf("removed before purge_at %v", at)
	}
	if n := deadLetters("hook"); n != 1 {
		t.Fatalf("the file's sink has %d dead letters, want its 1", n)
	}
}

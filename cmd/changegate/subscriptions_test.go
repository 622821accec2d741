package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// apiRecorder answers as the admin API does and records each request.
type apiRecorder struct {
	mu   sync.Mutex
	reqs []string // "METHOD PATH?QUERY auth body"
}

func newAPIRecorder(t *testing.T) (*apiRecorder, *httptest.Server) {
	r := &apiRecorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.reqs = append(r.reqs, req.Method+" "+req.URL.RequestURI()+" "+req.Header.Get("Authorization")+" "+string(body))
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case req.Header.Get("Authorization") != "Bearer tok-0123456789abcdef":
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"a bearer token is required"}`)
		case req.Method == "GET" && req.URL.Path == "/api/v1/subscriptions":
			io.WriteString(w, `{"subscriptions":[{"name":"team-a-x","status":"active"},{"name":"file-rule","managed_by":"config"}],"next":"CUR"}`)
		case req.Method == "POST" && req.URL.Path == "/api/v1/subscriptions" && strings.Contains(string(body), `"url":"http://10.0.0.1/"`):
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"invalid subscription","problems":[{"path":"$.sink.url","message":"a private address"}]}`)
		case req.Method == "POST" && req.URL.Path == "/api/v1/subscriptions":
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"name":"team-a-x","status":"active","secret":"whsec_AAAA"}`)
		case req.URL.Path == "/api/v1/subscriptions/team-b-x":
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"error":"token team-a manages only subscriptions whose names start with \"team-a-\""}`)
		case req.Method == "DELETE":
			io.WriteString(w, `{"name":"team-a-x","deleted":true}`)
		default:
			io.WriteString(w, `{"name":"team-a-x","status":"paused"}`)
		}
	}))
	t.Cleanup(srv.Close)
	return r, srv
}

func (r *apiRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

func (r *apiRecorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) == 0 {
		return ""
	}
	return r.reqs[len(r.reqs)-1]
}

// TestSubscriptionsCommand drives each subcommand against a server that
// answers as the API does: the method, path, body and bearer token of
// each request, what is printed, the secret shown once with its warning,
// an API error with its JSON paths on standard error (exit 1), and the
// token read from the environment or a file, never a flag.
func TestSubscriptionsCommand(t *testing.T) {
	rec, srv := newAPIRecorder(t)
	t.Setenv("CHANGEGATE_API_URL", srv.URL)
	t.Setenv("CHANGEGATE_API_TOKEN", "tok-0123456789abcdef")
	dir := t.TempDir()
	body := filepath.Join(dir, "sub.json")
	os.WriteFile(body, []byte(`{"name":"team-a-x","source":"items","sink":{"type":"webhook","url":"https://hooks.example.com/"}}`), 0o600)
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"name":"team-a-y","source":"items","sink":{"type":"webhook","url":"http://10.0.0.1/"}}`), 0o600)

	cases := []struct {
		args          []string
		code          int
		req, out, err string
	}{
		{[]string{"list", "-limit", "2"}, 0, "GET /api/v1/subscriptions?limit=2 Bearer tok-0123456789abcdef ", `{"name":"team-a-x","status":"active"}` + "\n" + `{"name":"file-rule","managed_by":"config"}`, "next: CUR"},
		{[]string{"list", "-after", "CUR"}, 0, "GET /api/v1/subscriptions?after=CUR", "team-a-x", ""},
		{[]string{"show", "team-a-x"}, 0, "GET /api/v1/subscriptions/team-a-x ", `"status": "paused"`, ""},
		{[]string{"create", "-f", body}, 0, `POST /api/v1/subscriptions Bearer tok-0123456789abcdef {"name":"team-a-x"`, `"secret": "whsec_AAAA"`, "shown this once"},
		{[]string{"create", "-f", bad}, 1, "POST /api/v1/subscriptions", "", "400 invalid subscription\n  $.sink.url: a private address"},
		{[]string{"pause", "team-a-x", "-reason", "maintenance"}, 0, `POST /api/v1/subscriptions/team-a-x/pause Bearer tok-0123456789abcdef {"reason":"maintenance"}`, "paused", ""},
		{[]string{"resume", "team-a-x"}, 0, "POST /api/v1/subscriptions/team-a-x/resume Bearer tok-0123456789abcdef ", "team-a-x", ""},
		{[]string{"rotate-secret", "-overlap", "1h", "team-a-x"}, 0, `POST /api/v1/subscriptions/team-a-x/rotate-secret Bearer tok-0123456789abcdef {"overlap":"1h"}`, "team-a-x", "shown this once"},
		{[]string{"delete", "team-a-x"}, 0, "DELETE /api/v1/subscriptions/team-a-x ", "deleted", ""},
		{[]string{"show", "team-b-x"}, 1, "GET /api/v1/subscriptions/team-b-x", "", `403 token team-a manages only subscriptions whose names start with "team-a-"`},
		{[]string{"show", "a/b"}, 0, "GET /api/v1/subscriptions/a%2Fb ", "", ""},
		{[]string{"pause"}, 2, "", "", "a subscription NAME is required"},
		{[]string{"create"}, 2, "", "", "-f FILE is required"},
		{[]string{"frobnicate"}, 2, "", "", "unknown command"},
		{[]string{"list", "-api", "ftp://x"}, 2, "", "", "want an http:// or https:// URL"},
	}
	for _, c := range cases {
		before := rec.last()
		var out, errb bytes.Buffer
		code := run(append([]string{"subscriptions"}, c.args...), &out, &errb)
		if code != c.code {
			t.Fatalf("%v: exit %d, want %d\nstdout: %s\nstderr: %s", c.args, code, c.code, out.String(), errb.String())
		}
		got := rec.last()
		if c.req == "" && got != before {
			t.Fatalf("%v: sent %q, want no request", c.args, got)
		}
		if c.req != "" && !strings.HasPrefix(got, c.req) {
			t.Fatalf("%v: sent %q, want %q", c.args, got, c.req)
		}
		if !strings.Contains(out.String(), c.out) || !strings.Contains(errb.String(), c.err) {
			t.Fatalf("%v: stdout %q (want %q), stderr %q (want %q)", c.args, out.String(), c.out, errb.String(), c.err)
		}
		if strings.Contains(errb.String(), "tok-0123456789abcdef") || strings.Contains(out.String(), "tok-0123456789abcdef") {
			t.Fatalf("%v: the token was printed", c.args)
		}
	}

	// The token from a file; none at all is refused before any request.
	tokFile := filepath.Join(dir, "token")
	os.WriteFile(tokFile, []byte("tok-0123456789abcdef\n"), 0o600)
	t.Setenv("CHANGEGATE_API_TOKEN", "")
	var out, errb bytes.Buffer
	if code := run([]string{"subscriptions", "show", "team-a-x", "-token-file", tokFile}, &out, &errb); code != 0 || !strings.HasSuffix(rec.last(), "Bearer tok-0123456789abcdef ") {
		t.Fatalf("-token-file: exit %d, sent %q, stderr %s", code, rec.last(), errb.String())
	}
	n := rec.count()
	if code := run([]string{"subscriptions", "list"}, &out, &errb); code != 2 || rec.count() != n || !strings.Contains(errb.String(), "no API token") {
		t.Fatalf("no token: exit %d, %d requests, stderr %s", code, rec.count()-n, errb.String())
	}
}

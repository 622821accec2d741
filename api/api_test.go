package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
)

// gateway is an api.Gateway with a fixed configuration and nothing
// running.
type gateway struct{ cfg *config.Config }

func (g gateway) Config() *config.Config { return g.cfg }

func (gateway) Status() api.Status { return api.Status{Ready: true} }

func (gateway) Reload() error { return nil }

func (gateway) Replay(context.Context, deadletter.Filter, bool) (deadletter.ReplayResult, error) {
	return deadletter.ReplayResult{}, nil
}

// TestRoutesAccess: a route registered through Routes is served to the
// principals its Access admits, with that principal in the request, and
// refused to the others with the one JSON error shape (401 when a token
// would help, 403 when none can); a group that is off answers 404 before
// any access check.
func TestRoutesAccess(t *testing.T) {
	const token = "the-admin-token-0123"
	for _, tc := range []struct {
		name       string
		server     config.Server
		access     api.Access
		bearer     string
		on         bool
		want       int
		wantAdmin  bool
		wantAnswer string // the error, when refused
	}{
		{"open anonymous", config.Server{AdminToken: token}, api.Open, "", true, 200, false, ""},
		{"open admin", config.Server{AdminToken: token}, api.Open, token, true, 200, true, ""},
		{"read anonymous", config.Server{AdminToken: token}, api.Read, "", true, 401, false, "missing or wrong bearer token"},
		{"read wrong token", config.Server{AdminToken: token}, api.Read, "nope", true, 401, false, "missing or wrong bearer token"},
		{"read admin", config.Server{AdminToken: token}, api.Read, token, true, 200, true, ""},
		{"read public", config.Server{PublicRead: true}, api.Read, "", true, 200, false, ""},
		{"read no token configured", config.Server{}, api.Read, "x", true, 403, false, "reading status and dead letters needs a token: set server.admin_token, or server.public_read = true to serve them to anyone who can reach the admin server"},
		{"mutate anonymous", config.Server{AdminToken: token, PublicRead: true}, api.Mutate, "", true, 401, false, "missing or wrong bearer token"},
		{"mutate admin", config.Server{AdminToken: token}, api.Mutate, token, true, 200, true, ""},
		{"mutate no token configured", config.Server{PublicRead: true}, api.Mutate, "", true, 403, false, "mutating admin API calls are disabled: set server.admin_token to enable them"},
		{"group off", config.Server{}, api.Mutate, "", false, 404, false, ""},
		{"group off admin", config.Server{AdminToken: token}, api.Read, token, false, 404, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := api.New(api.Options{Gateway: gateway{cfg: &config.Config{Server: tc.server}}})
			var got *api.Principal
			srv.Routes(func() bool { return tc.on }).Handle("POST /x/{id}", tc.access, func(w http.ResponseWriter, r *http.Request) {
				p := api.PrincipalOf(r)
				got = &p
				api.WriteJSON(w, http.StatusOK, map[string]string{"id": r.PathValue("id")})
			})
			req := httptest.NewRequest("POST", "/x/7", nil)
			if tc.bearer != "" {
				req.Header.Set("Authorization", "bearer "+tc.bearer)
			}
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, req)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
			switch {
			case tc.want == 200:
				if got == nil || got.Admin != tc.wantAdmin {
					t.Fatalf("principal %+v, want admin %v", got, tc.wantAdmin)
				}
			case got != nil:
				t.Fatalf("handler ran for a refused request (principal %+v)", *got)
			case tc.wantAnswer != "":
				var e api.Error
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error != tc.wantAnswer || w.Header().Get("Content-Type") != "application/json" {
					t.Fatalf("answer %q (%v), want {\"error\": %q}", w.Body, err, tc.wantAnswer)
				}
				if (w.Code == 401) != (w.Header().Get("WWW-Authenticate") != "") {
					t.Fatalf("status %d with WWW-Authenticate %q", w.Code, w.Header().Get("WWW-Authenticate"))
				}
			}
		})
	}
}

var errRejected = errors.New("thing rejected; nothing changed")

// TestRefusal: an error wrapping a sentinel is the sentinel's text and a
// problem per line of the rest; another error is its text alone.
func TestRefusal(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want api.Error
	}{
		{fmt.Errorf("%w:\nfirst at a.toml:3\n\n  second at a.toml:9\n", errRejected), api.Error{Error: errRejected.Error(), Problems: []string{"first at a.toml:3", "second at a.toml:9"}}},
		{fmt.Errorf("%w: [mongo] changed, which takes a restart", errRejected), api.Error{Error: errRejected.Error(), Problems: []string{"[mongo] changed, which takes a restart"}}},
		{errors.New("plain"), api.Error{Error: "plain"}},
	} {
		if got := api.Refusal(tc.err); got.Error != tc.want.Error || !slices.Equal(got.Problems, tc.want.Problems) {
			t.Errorf("Refusal(%q) = %+v, want %+v", tc.err, got, tc.want)
		}
	}
}

// TestPage: a full page names the next cursor, a short one does not, and
// an error after the page began ends it with the error (the items before
// it kept).
func TestPage(t *testing.T) {
	type body struct {
		Items []int `json:"items"`
		Next  *string
		Error *string
	}
	for _, tc := range []struct {
		name      string
		limit, n  int
		err       error
		wantNext  string
		wantError string
	}{
		{"full", 2, 2, nil, "c1", ""},
		{"short", 3, 2, nil, "", ""},
		{"empty", 3, 0, nil, "", ""},
		{"failed half way", 3, 1, errors.New("cursor lost"), "", "cursor lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			p := api.NewPage(w, "items", tc.limit)
			p.Begin()
			for i := range tc.n {
				if err := p.Add([]byte(fmt.Sprint(i)), fmt.Sprint("c", i)); err != nil {
					t.Fatal(err)
				}
			}
			p.End(tc.err)
			var b body
			if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
				t.Fatalf("%v: %s", err, w.Body)
			}
			if len(b.Items) != tc.n || (b.Next != nil) != (tc.wantNext != "") || (b.Next != nil && *b.Next != tc.wantNext) ||
				(b.Error != nil) != (tc.wantError != "") || (b.Error != nil && *b.Error != tc.wantError) {
				t.Fatalf("page %s", w.Body)
			}
		})
	}
}

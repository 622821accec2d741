package api

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"

	"github.com/changegate/changegate/config"
)

// Principal is who a request acts for, as the auth layer resolved it from
// its bearer token. Every handler finds it with PrincipalOf.
type Principal struct {
	// Name names the principal in logs: "admin" for the admin token, ""
	// for a request without a token the server knows.
	Name string
	// Admin is set for server.admin_token: every route is open to it.
	Admin bool
	// Prefix is set for a [[server.tokens]] token (Name is its name): it
	// may manage only the subscriptions whose names start with Prefix.
	Prefix string
}

// Manages reports whether p may manage the subscription named name.
func (p Principal) Manages(name string) bool {
	return p.Admin || p.Prefix != "" && strings.HasPrefix(name, p.Prefix)
}

// ListPrefix returns the name prefix of a listing of subscriptions p
// asked for with prefix: as asked for the admin token, and for a scoped
// token narrowed to its own prefix unless it asked for a longer one.
func (p Principal) ListPrefix(prefix string) string {
	if !p.Admin && !strings.HasPrefix(prefix, p.Prefix) {
		return p.Prefix
	}
	return prefix
}

// Access is what a route needs from the request's principal.
type Access int

const (
	// Open routes serve anyone who reaches the listener: the probes,
	// /metrics, the console's pages (which render their data only for a
	// principal that may read it) and its static files.
	Open Access = iota
	// Read routes serve data (status details, dead letters, backfills):
	// the admin token, or anyone with server.public_read.
	Read
	// Mutate routes change state: the admin token, and no one while none
	// is configured.
	Mutate
	// Scoped routes (the subscriptions') serve the admin token and the
	// [[server.tokens]] tokens; the handler checks a token's prefix.
	Scoped
	// ReadOwn routes serve data as Read routes do, and to the
	// [[server.tokens]] tokens only what belongs to the sinks whose
	// names start with the token's prefix (their subscriptions' sinks):
	// the handler narrows the reply with Principal.Narrowed (dead
	// letters, deliveries, event lifecycles, analytics).
	ReadOwn
)

// Narrowed reports whether p's reads are narrowed to the sinks whose names
// start with p.Prefix: a [[server.tokens]] token.
func (p Principal) Narrowed() bool { return !p.Admin && p.Prefix != "" }

// refuseSink answers 403 and returns true when p's reads are narrowed and
// sink is not one of its prefix's.
func refuseSink(w http.ResponseWriter, p Principal, sink string) bool {
	if !p.Narrowed() || strings.HasPrefix(sink, p.Prefix) {
		return false
	}
	WriteError(w, http.StatusForbidden, fmt.Sprintf("token %s reads only the sinks whose names start with %q", p.Name, p.Prefix))
	return true
}

type principalKey struct{}

// PrincipalOf returns the principal of a request served by a Server (the
// zero Principal, anonymous, for any other).
func PrincipalOf(r *http.Request) Principal {
	p, _ := r.Context().Value(principalKey{}).(Principal)
	return p
}

// bearer returns the token of an Authorization header using the Bearer
// scheme (matched case-insensitively, RFC 9110 §11.1), and false when the
// header is absent or uses another scheme.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// authenticate resolves r's principal under cfg: the admin token, or
// anonymous (no token, a wrong one, or none configured).
func authenticate(cfg *config.Config, r *http.Request) Principal {
	token := cfg.Server.AdminToken.Value()
	got, ok := bearer(r.Header.Get("Authorization"))
	if token != "" && ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
		return Principal{Name: "admin", Admin: true}
	}
	if ok {
		for _, t := range cfg.Server.Tokens {
			if subtle.ConstantTimeCompare([]byte(got), []byte(t.Token.Value())) == 1 {
				return Principal{Name: t.Name, Prefix: t.Prefix}
			}
		}
	}
	return Principal{}
}

// mayRead reports whether p may read data under cfg: with
// server.public_read, or with the admin token.
func mayRead(cfg *config.Config, p Principal) bool {
	return cfg.Server.PublicRead || p.Admin
}

// guard serves h to the requests whose principal has access a under the
// configuration in force (read per request, so a reload applies), with
// the principal in the request's context; it refuses the others with 401
// (a token would help) or 403 (none can).
func (s *Server) guard(a Access, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		cfg := s.gw.Config()
		p := authenticate(cfg, r)
		switch {
		case a == ReadOwn && !mayRead(cfg, p) && p.Prefix == "" && cfg.Server.AdminToken.Value() == "" && len(cfg.Server.Tokens) == 0,
			a == Read && !mayRead(cfg, p) && cfg.Server.AdminToken.Value() == "":
			WriteError(w, http.StatusForbidden, "reading status and dead letters needs a token: set server.admin_token, or server.public_read = true to serve them to anyone who can reach the admin server")
			return
		case a == Mutate && cfg.Server.AdminToken.Value() == "":
			WriteError(w, http.StatusForbidden, "mutating admin API calls are disabled: set server.admin_token to enable them")
			return
		case a == Scoped && cfg.Server.AdminToken.Value() == "" && len(cfg.Server.Tokens) == 0:
			WriteError(w, http.StatusForbidden, "subscriptions need a token: set server.admin_token or [[server.tokens]]")
			return
		case a == Read && !mayRead(cfg, p), a == ReadOwn && !mayRead(cfg, p) && p.Prefix == "",
			a == Mutate && !p.Admin, a == Scoped && !p.Admin && p.Prefix == "":
			w.Header().Set("WWW-Authenticate", `Bearer realm="changegate"`)
			WriteError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	}
}

package app

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Limits of the admin server. No endpoint takes a request body; the longest
// replies (a dead-letter listing, one entry in full) are written well
// within adminWriteTimeout, and a replay, which waits for deliveries, lifts
// the write deadline for itself.
const (
	adminReadHeaderTimeout = 10 * time.Second
	adminReadTimeout       = 30 * time.Second
	adminWriteTimeout      = 2 * time.Minute
	adminIdleTimeout       = 2 * time.Minute
	adminMaxHeaderBytes    = 64 << 10
	adminMaxBodyBytes      = 64 << 10
)

// newAdminServer returns the admin HTTP server: timeouts, header and body
// limits, the Host check (server.allowed_hosts) in front of every endpoint.
func (g *gateway) newAdminServer(reg *prometheus.Registry) *http.Server {
	hostname, _ := os.Hostname()
	listenHost := ""
	if h, _, err := net.SplitHostPort(g.config().Server.Listen); err == nil {
		listenHost = h
	}
	return &http.Server{
		Handler:           g.checkHost(hostDefaults(listenHost, hostname), g.handler(reg)),
		ReadHeaderTimeout: adminReadHeaderTimeout,
		ReadTimeout:       adminReadTimeout,
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    adminMaxHeaderBytes,
	}
}

// hostDefaults returns the host names accepted when server.allowed_hosts
// is not set: localhost, the host of server.listen (when it is a name) and
// the machine's host name (in Kubernetes, the pod's name), in lower case.
func hostDefaults(listenHost, hostname string) []string {
	out := []string{"localhost"}
	for _, h := range []string{listenHost, hostname} {
		h = strings.TrimSuffix(strings.ToLower(h), ".")
		if h != "" && net.ParseIP(h) == nil {
			out = append(out, h)
		}
	}
	return out
}

// hostAllowed reports whether a request addressed to host (the Host header,
// with or without port) may be served: an IP literal, a name of allowed
// (or of defaults when allowed is nil), localhost or a *.localhost name,
// or anything when allowed holds "*". An empty Host (HTTP/1.0) is
// accepted: a browser always sends one.
func hostAllowed(host string, allowed, defaults []string) bool {
	if host == "" {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if net.ParseIP(host) != nil {
		return true
	}
	if allowed == nil {
		allowed = defaults
	}
	for _, a := range allowed {
		if a == "*" || a == host {
			return true
		}
	}
	return host == "localhost" || strings.HasSuffix(host, ".localhost")
}

// checkHost refuses (421) requests addressed to a host name the admin
// server does not answer to (DNS rebinding), and bounds request bodies.
func (g *gateway) checkHost(defaults []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r.Host, g.config().Server.AllowedHosts, defaults) {
			writeJSON(w, http.StatusMisdirectedRequest, apiError{fmt.Sprintf("host %q is not served here: add it to server.allowed_hosts to accept requests addressed to it", r.Host)})
			return
		}
		if r.ContentLength > adminMaxBodyBytes {
			writeJSON(w, http.StatusRequestEntityTooLarge, apiError{fmt.Sprintf("request body of %d bytes: the admin API takes at most %d", r.ContentLength, adminMaxBodyBytes)})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, adminMaxBodyBytes)
		next.ServeHTTP(w, r)
	})
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

// authorized reports whether r carries the configured admin token; false
// when none is configured.
func (g *gateway) authorized(r *http.Request) bool {
	token := g.config().Server.AdminToken.Value()
	got, ok := bearer(r.Header.Get("Authorization"))
	return token != "" && ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// mayRead reports whether r may read data (status details, dead letters):
// with server.public_read, or with the admin token.
func (g *gateway) mayRead(r *http.Request) bool {
	return g.config().Server.PublicRead || g.authorized(r)
}

// reading guards an endpoint that reads data: it needs the admin token
// unless server.public_read is set.
func (g *gateway) reading(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if g.mayRead(r) {
			h(w, r)
			return
		}
		if g.config().Server.AdminToken.Value() == "" {
			writeJSON(w, http.StatusForbidden, apiError{"reading status and dead letters needs a token: set server.admin_token, or server.public_read = true to serve them to anyone who can reach the admin server"})
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="changegate"`)
		writeJSON(w, http.StatusUnauthorized, apiError{"missing or wrong bearer token"})
	}
}

// mutating guards an endpoint that changes state: it needs the configured
// admin token as a bearer token, and is disabled when none is configured.
func (g *gateway) mutating(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if g.config().Server.AdminToken.Value() == "" {
			writeJSON(w, http.StatusForbidden, apiError{"mutating admin API calls are disabled: set server.admin_token to enable them"})
			return
		}
		if !g.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="changegate"`)
			writeJSON(w, http.StatusUnauthorized, apiError{"missing or wrong bearer token"})
			return
		}
		h(w, r)
	}
}

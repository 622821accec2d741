package api

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// Limits of the admin server. The longest replies (a dead-letter listing,
// one entry in full) are written well within writeTimeout, and a replay,
// which waits for deliveries, lifts the write deadline for itself.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 2 * time.Minute
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
	// MaxBodyBytes bounds every request body.
	MaxBodyBytes = 64 << 10
)

// HTTPServer returns the admin HTTP server of s: timeouts, header and body
// limits, the Host check (server.allowed_hosts) in front of every route.
func (s *Server) HTTPServer() *http.Server {
	hostname, _ := os.Hostname()
	listenHost := ""
	if h, _, err := net.SplitHostPort(s.gw.Config().Server.Listen); err == nil {
		listenHost = h
	}
	return &http.Server{
		Handler:           s.checkHost(hostDefaults(listenHost, hostname), s),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
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
// server does not answer to (DNS rebinding), and bounds request bodies to
// MaxBodyBytes.
func (s *Server) checkHost(defaults []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r.Host, s.gw.Config().Server.AllowedHosts, defaults) {
			WriteError(w, http.StatusMisdirectedRequest, fmt.Sprintf("host %q is not served here: add it to server.allowed_hosts to accept requests addressed to it", r.Host))
			return
		}
		if r.ContentLength > MaxBodyBytes {
			WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes: the admin API takes at most %d", r.ContentLength, MaxBodyBytes))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		next.ServeHTTP(w, r)
	})
}

// DecodeJSON decodes r's body (bounded by MaxBodyBytes) into v, refusing
// fields v does not have.
func DecodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

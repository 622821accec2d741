// Package api owns the admin HTTP server: its routes and their
// registration, the auth layer (the bearer token a request carries resolved
// to a Principal, and each route's Access), the Host check against DNS
// rebinding, the server's limits (timeouts, headers, bounded request
// bodies), the one JSON error shape every handler answers with, cursor
// pagination, and the handlers of /api/v1 (status, dead letters, replay,
// purge, reload, backfills, the delivery log's events, deliveries and
// analytics) and of the probes and /metrics.
//
// The API reads and acts on the running gateway through small interfaces
// (Gateway, DeadLetters, Backfills) that package app implements or passes;
// it never imports app. Other packages add their routes through Routes (the
// console does).
package api

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
)

// Gateway is the running gateway as the API sees it. Its methods are safe
// for concurrent use.
type Gateway interface {
	// Config returns the configuration in force; a reload replaces it, so
	// every request reads it anew.
	Config() *config.Config
	// Status reports every unit, source and sink, and whether the gateway
	// is ready.
	Status() Status
	// Reload re-reads the configuration and applies it; an error (a
	// sentinel wrapped with the reasons, see Refusal) leaves the running
	// configuration in force.
	Reload() error
	// Replay re-delivers the failed dead letters f selects, routed and
	// shaped by the current rules; deliverUnrouted also delivers those no
	// current rule routes to their sink.
	Replay(ctx context.Context, f deadletter.Filter, deliverUnrouted bool) (deadletter.ReplayResult, error)
}

// DeadLetters is the dead-letter store as the API and the console read it
// (deadletter.Store).
type DeadLetters interface {
	Summaries(ctx context.Context, f deadletter.Filter, ready func(), fn func(deadletter.Entry) error) error
	Get(ctx context.Context, id string) (deadletter.Entry, bool, error)
	Count(ctx context.Context, f deadletter.Filter) (int64, error)
	Purge(ctx context.Context, f deadletter.Filter) (int64, error)
}

// Backfills are the gateway's backfills (backfill.Runner).
type Backfills interface {
	Start(ctx context.Context, cfg *config.Config, req backfill.Request) (backfill.Status, error)
	List() []backfill.Status
	Get(id string) (backfill.Status, bool)
	Cancel(ctx context.Context, id string) (backfill.Status, error)
	// RedeliverEvent reads the change with event id again from the oplog
	// and delivers it once more to sink (backfill.Runner.RedeliverEvent).
	RedeliverEvent(ctx context.Context, id, sink string) (backfill.Redelivered, error)
}

var (
	_ DeadLetters = (*deadletter.Store)(nil)
	_ Backfills   = (*backfill.Runner)(nil)
)

// Options are what a Server serves.
type Options struct {
	Gateway     Gateway
	DeadLetters DeadLetters
	// Backfills nil: /api/v1/backfills is not served.
	Backfills Backfills
	// Deliveries nil: /api/v1/events, /deliveries and /analytics are not
	// served.
	Deliveries Deliveries
	// DeliveryLogDropped returns the records this process dropped, for
	// the analytics' covers (nil: unknown).
	DeliveryLogDropped func() int64
	// Registry is served at /metrics (nil: not served).
	Registry *prometheus.Registry
	// Log receives the handlers' log lines; nil discards.
	Log *slog.Logger
	// Subscriptions nil: /api/v1/subscriptions is not served.
	Subscriptions *Subscriptions
}

// Server is the admin server's handler: the API's routes and those other
// packages register. Register every route before serving; it is then safe
// for concurrent use.
type Server struct {
	gw  Gateway
	dls DeadLetters
	bfs Backfills
	// deliveries and dropped: Options.Deliveries, DeliveryLogDropped.
	deliveries Deliveries
	dropped    func() int64
	log        *slog.Logger
	mux        *http.ServeMux
	payloads   *PayloadGate
	subs       *Subscriptions
	// patterns: every pattern registered, for the OpenAPI document's test.
	patterns []string
}

// New returns a Server with the API's routes registered.
func New(o Options) *Server {
	s := &Server{gw: o.Gateway, dls: o.DeadLetters, bfs: o.Backfills, deliveries: o.Deliveries, dropped: o.DeliveryLogDropped, log: o.Log, mux: http.NewServeMux(),
		payloads: NewPayloadGate(MaxPayloads)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	all := s.Routes(nil)
	s.statusRoutes(all, o.Registry)
	s.deadLetterRoutes(all)
	if s.bfs != nil {
		s.backfillRoutes(all)
	}
	if s.deliveries != nil {
		s.deliveryRoutes(all)
	}
	if o.Subscriptions != nil {
		s.subs = o.Subscriptions
		s.subscriptionRoutes()
	}
	all.Handle("POST /api/v1/reload", Mutate, s.ServeReload)
	all.Handle("GET /api/v1/openapi.json", Open, serveOpenAPI)
	return s
}

// Routes registers a group of routes on a Server.
type Routes struct {
	s  *Server
	on func() bool
}

// Routes returns a group whose routes answer 404, before any access
// check, while on returns false (nil: always on), as a route that does not
// exist would: the console while server.console is false.
func (s *Server) Routes(on func() bool) *Routes { return &Routes{s: s, on: on} }

// Handle registers h for pattern (an http.ServeMux pattern, such as
// "GET /api/v1/status"), served to the principals with access a.
func (rs *Routes) Handle(pattern string, a Access, h http.HandlerFunc) {
	h = rs.s.guard(a, h)
	if on := rs.on; on != nil {
		next := h
		h = func(w http.ResponseWriter, r *http.Request) {
			if !on() {
				http.NotFound(w, r)
				return
			}
			next(w, r)
		}
	}
	rs.s.patterns = append(rs.s.patterns, pattern)
	rs.s.mux.HandleFunc(pattern, h)
}

// ServeHTTP routes r.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/readyz" {
		dataHeaders(w.Header())
	}
	s.mux.ServeHTTP(w, r)
}

// dataHeaders sets the headers of every /api/v1 and /readyz response: they
// carry data (documents of dead letters, error texts, positions) that no
// cache may keep and no browser may sniff into another type, as the
// console's pages do.
func dataHeaders(h http.Header) {
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
}

// Payloads is the bound on whole dead-letter entries read at once, shared
// by every route that reads one (the API's and the console's).
func (s *Server) Payloads() *PayloadGate { return s.payloads }

// ServeReload re-reads the configuration and applies it (POST
// /api/v1/reload, and the console's reload): 200, or 400 with the reasons
// the reload was rejected (Refusal) and the running configuration left in
// force. The admin API and the console share it.
func (s *Server) ServeReload(w http.ResponseWriter, _ *http.Request) {
	if err := s.gw.Reload(); err != nil {
		s.log.Error("reload failed", "err", err)
		WriteJSON(w, http.StatusBadRequest, Refusal(err))
		return
	}
	WriteJSON(w, http.StatusOK, map[string]string{"status": "reloaded"})
}

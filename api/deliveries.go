package api

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/changegate/changegate/deliverylog"
)

// Deliveries is the delivery log as the API reads it (deliverylog.Log).
type Deliveries interface {
	List(ctx context.Context, f deliverylog.Filter) (deliverylog.Page, error)
	Lifecycle(ctx context.Context, id string) (deliverylog.Lifecycle, error)
	Analytics(ctx context.Context, window string, dropped int64) (deliverylog.Analytics, error)
}

var _ Deliveries = (*deliverylog.Log)(nil)

// deliveryRoutes registers the delivery log's reads.
func (s *Server) deliveryRoutes(rs *Routes) {
	rs.Handle("GET /api/v1/events/{id}", ReadOwn, s.showEvent)
	rs.Handle("GET /api/v1/deliveries", ReadOwn, s.listDeliveries)
	rs.Handle("GET /api/v1/analytics", ReadOwn, s.showAnalytics)
}

// DeliveryQueryOf reads the query parameters of GET /api/v1/deliveries:
// sink, rule, source, status, since, until, document_key, min_attempts,
// min_duration, limit and after (the next cursor of the previous page).
func DeliveryQueryOf(r *http.Request) deliverylog.Query {
	v := r.URL.Query()
	return deliverylog.Query{Sink: v.Get("sink"), Rule: v.Get("rule"), Source: v.Get("source"), Status: v.Get("status"),
		Since: v.Get("since"), Until: v.Get("until"), DocumentKey: v.Get("document_key"), MinAttempts: v.Get("min_attempts"),
		MinDuration: v.Get("min_duration"), Limit: v.Get("limit"), Cursor: v.Get("after")}
}

// deliveryError answers err of a delivery log read: 400 for a bad filter,
// 404 for an unknown event, else 500.
func deliveryError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, deliverylog.ErrBadFilter):
		code = http.StatusBadRequest
	case errors.Is(err, deliverylog.ErrNotFound):
		code = http.StatusNotFound
	}
	WriteError(w, code, err.Error())
}

// listDeliveries serves GET /api/v1/deliveries: {"records": [...], "next":
// CURSOR}, newest first; next is present when more records follow.
func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) {
	f, err := DeliveryQueryOf(r).Filter(time.Now())
	if err != nil {
		deliveryError(w, err)
		return
	}
	if pr := PrincipalOf(r); pr.Narrowed() {
		if f.Sink != "" && refuseSink(w, pr, f.Sink) {
			return
		}
		f.SinkPrefix = pr.Prefix
	}
	p, err := s.deliveries.List(r.Context(), f)
	if err != nil {
		deliveryError(w, err)
		return
	}
	body := map[string]any{"records": p.Records}
	if p.Records == nil {
		body["records"] = []deliverylog.Record{}
	}
	if p.Next != "" {
		body["next"] = p.Next
	}
	WriteJSON(w, http.StatusOK, body)
}

// showEvent serves GET /api/v1/events/{id}: the event's lifecycle at each
// sink (deliverylog.Lifecycle); 404 when nothing is known of it.
func (s *Server) showEvent(w http.ResponseWriter, r *http.Request) {
	lc, err := s.deliveries.Lifecycle(r.Context(), r.PathValue("id"))
	if err != nil {
		deliveryError(w, err)
		return
	}
	if p := PrincipalOf(r); p.Narrowed() {
		// A scoped token sees the sinks of its prefix only, and 403 for
		// an event none of them got.
		lc.Sinks = slices.DeleteFunc(lc.Sinks, func(sl deliverylog.SinkLifecycle) bool { return !strings.HasPrefix(sl.Sink, p.Prefix) })
		if len(lc.Sinks) == 0 && refuseSink(w, p, "") {
			return
		}
	}
	WriteJSON(w, http.StatusOK, lc)
}

// showAnalytics serves GET /api/v1/analytics?window=1h|6h|24h|7d (default
// 24h): counts and latency per sink and per rule, with what they cover.
func (s *Server) showAnalytics(w http.ResponseWriter, r *http.Request) {
	window := r.URL.Query().Get("window")
	if window == "" {
		window = "24h"
	}
	a, err := s.Analytics(r.Context(), window)
	if err != nil {
		deliveryError(w, err)
		return
	}
	if p := PrincipalOf(r); p.Narrowed() {
		// A scoped token sees its sinks and rules (a subscription's are
		// named after it).
		other := func(g deliverylog.Group) bool { return !strings.HasPrefix(g.Name, p.Prefix) }
		a.Sinks = slices.DeleteFunc(a.Sinks, other)
		a.Rules = slices.DeleteFunc(a.Rules, other)
	}
	WriteJSON(w, http.StatusOK, a)
}

// Deliveries returns the delivery log the server reads (Options.Deliveries;
// nil when /api/v1/events, /deliveries and /analytics are not served), for
// the console's pages, which read it as the API does.
func (s *Server) Deliveries() Deliveries { return s.deliveries }

// Analytics returns the figures of window (deliverylog.Windows) as GET
// /api/v1/analytics answers them: with what this process dropped in the
// covers. The delivery log must be served (Deliveries not nil).
func (s *Server) Analytics(ctx context.Context, window string) (deliverylog.Analytics, error) {
	var dropped int64 = -1
	if s.dropped != nil {
		dropped = s.dropped()
	}
	return s.deliveries.Analytics(ctx, window, dropped)
}

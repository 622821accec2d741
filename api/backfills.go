package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/source"
)

// backfillRoutes registers /api/v1/backfills.
func (s *Server) backfillRoutes(rs *Routes) {
	rs.Handle("POST /api/v1/backfills", Mutate, s.startBackfill)
	rs.Handle("GET /api/v1/backfills", Read, s.listBackfills)
	rs.Handle("GET /api/v1/backfills/{id}", Read, s.showBackfill)
	rs.Handle("DELETE /api/v1/backfills/{id}", Mutate, s.cancelBackfill)
	rs.Handle("POST /api/v1/events/{id}/redeliver", Mutate, s.redeliverEvent)
	rs.Handle("POST /api/v1/sinks/{name}/redeliver", Mutate, s.redeliverRange)
}

// backfillBody is the body of POST /api/v1/backfills. filter may be a JSON
// object (Extended JSON) or a string holding one.
type backfillBody struct {
	Source string          `json:"source"`
	Sink   string          `json:"sink"`
	Filter json.RawMessage `json:"filter"`
	Rate   float64         `json:"rate"`
}

// startBackfill serves POST /api/v1/backfills: 202 with the new backfill's
// status; 400 for a bad request, 409 when a sink is busy (nothing started).
func (s *Server) startBackfill(w http.ResponseWriter, r *http.Request) {
	var body backfillBody
	if err := DecodeJSON(r, &body); err != nil {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("body must be a JSON object {\"source\", \"sink\", \"filter\", \"rate\"}: %v", err))
		return
	}
	req := backfill.Request{Source: body.Source, Sink: body.Sink, Rate: body.Rate}
	var ok bool
	if req.Filter, ok = filterText(w, body.Filter); !ok {
		return
	}
	s.serveStart(w, r, req)
}

// serveStart starts the backfill (or redelivery) req and answers 202 with
// its status and its Location; 400 for a bad request, 404 for an unknown
// sink of a redelivery, 409 when a sink is busy (nothing started).
func (s *Server) serveStart(w http.ResponseWriter, r *http.Request, req backfill.Request) {
	st, err := s.bfs.Start(context.WithoutCancel(r.Context()), s.gw.Config(), req)
	switch {
	case errors.Is(err, backfill.ErrInput):
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	case errors.Is(err, backfill.ErrUnknownSink):
		WriteError(w, http.StatusNotFound, err.Error())
		return
	case errors.Is(err, backfill.ErrBusy):
		WriteError(w, http.StatusConflict, err.Error())
		return
	case err != nil:
		WriteError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	w.Header().Set("Location", "/api/v1/backfills/"+st.ID)
	WriteJSON(w, http.StatusAccepted, st)
}

// filterText returns a filter given as a JSON object (Extended JSON) or a
// string holding one, as text; false (an error answered) when it is
// neither.
func filterText(w http.ResponseWriter, raw json.RawMessage) (string, bool) {
	f := bytes.TrimSpace(raw)
	if len(f) == 0 || bytes.Equal(f, []byte("null")) {
		return "", true
	}
	if f[0] != '"' {
		return string(f), true
	}
	var text string
	if err := json.Unmarshal(f, &text); err != nil {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("filter: %v", err))
		return "", false
	}
	return text, true
}

// redeliverBody is the body of POST /api/v1/sinks/{name}/redeliver.
type redeliverBody struct {
	Since  string          `json:"since"`
	Until  string          `json:"until"`
	Filter json.RawMessage `json:"filter"`
	Source string          `json:"source"`
	Rate   float64         `json:"rate"`
}

// redeliverRange serves POST /api/v1/sinks/{name}/redeliver {"since",
// "until", "filter", "source", "rate"}: the changes of the window are read
// again from the oplog and sent to that sink alone, as a backfill run of
// kind "redelivery" (followed at /api/v1/backfills/{id}); 202, 400, 404
// for an unknown sink, 409 when the sink runs another backfill.
func (s *Server) redeliverRange(w http.ResponseWriter, r *http.Request) {
	var body redeliverBody
	if err := DecodeJSON(r, &body); err != nil {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("body must be a JSON object {\"since\", \"until\", \"filter\", \"source\", \"rate\"}: %v", err))
		return
	}
	req := backfill.Request{Kind: backfill.KindRedelivery, Sink: r.PathValue("name"), Source: body.Source, Rate: body.Rate}
	for _, t := range []struct {
		name, text string
		to         *time.Time
	}{{"since", body.Since, &req.Since}, {"until", body.Until, &req.Until}} {
		if t.text == "" {
			WriteError(w, http.StatusBadRequest, t.name+" is required: an RFC 3339 time, e.g. 2026-11-28T10:00:00Z")
			return
		}
		v, err := time.Parse(time.RFC3339Nano, t.text)
		if err != nil {
			WriteError(w, http.StatusBadRequest, fmt.Sprintf("%s %q: want an RFC 3339 time, e.g. 2026-11-28T10:00:00Z", t.name, t.text))
			return
		}
		*t.to = v.UTC()
	}
	var ok bool
	if req.Filter, ok = filterText(w, body.Filter); !ok {
		return
	}
	s.serveStart(w, r, req)
}

// listBackfills serves GET /api/v1/backfills: the backfills of this
// process (the running ones and the last finished), oldest first.
func (s *Server) listBackfills(w http.ResponseWriter, _ *http.Request) {
	WriteJSON(w, http.StatusOK, map[string]any{"backfills": s.bfs.List()})
}

// showBackfill serves GET /api/v1/backfills/{id}.
func (s *Server) showBackfill(w http.ResponseWriter, r *http.Request) {
	st, ok := s.bfs.Get(r.PathValue("id"))
	if !ok {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("no backfill %q in this process", r.PathValue("id")))
		return
	}
	WriteJSON(w, http.StatusOK, st)
}

// cancelBackfill serves DELETE /api/v1/backfills/{id}: it stops reading
// and answers once the backfill ended (what was sent is delivered first),
// or after 20s with its current state.
func (s *Server) cancelBackfill(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	st, err := s.bfs.Cancel(ctx, r.PathValue("id"))
	if errors.Is(err, backfill.ErrNotFound) {
		WriteError(w, http.StatusNotFound, err.Error())
		return
	}
	WriteJSON(w, http.StatusOK, st)
}

// redeliverEvent serves POST /api/v1/events/{id}/redeliver {"sink": NAME}:
// the change is read again from the oplog and delivered once more to that
// sink (backfill.Runner.RedeliverEvent). 200 with what was delivered; 400
// for a bad request or an id that holds no stream position, 404 for an
// unknown sink or source or a change the oplog does not have, 409 when
// today's rules do not route the change to the sink or the sink is parked,
// 410 when the change is no longer in the oplog, 502 when the sink did not
// take it.
func (s *Server) redeliverEvent(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Sink string `json:"sink"`
	}
	if err := DecodeJSON(r, &body); err != nil {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("body must be a JSON object {\"sink\": NAME}: %v", err))
		return
	}
	if body.Sink == "" {
		WriteError(w, http.StatusBadRequest, "sink is required: the one sink to deliver the change to again")
		return
	}
	out, err := s.bfs.RedeliverEvent(r.Context(), r.PathValue("id"), body.Sink)
	if err != nil {
		WriteError(w, redeliveryStatus(err), err.Error())
		return
	}
	WriteJSON(w, http.StatusOK, out)
}

// redeliveryStatus is the HTTP status of a redelivery's error.
func redeliveryStatus(err error) int {
	switch {
	case errors.Is(err, backfill.ErrInput):
		return http.StatusBadRequest
	case errors.Is(err, backfill.ErrUnknownSink), errors.Is(err, backfill.ErrNoChange):
		return http.StatusNotFound
	case errors.Is(err, backfill.ErrGone), errors.Is(err, source.ErrHistoryLost):
		return http.StatusGone
	case errors.Is(err, deadletter.ErrNotRouted), errors.Is(err, router.ErrParked), errors.Is(err, backfill.ErrBusy):
		return http.StatusConflict
	case errors.Is(err, backfill.ErrDelivery):
		return http.StatusBadGateway
	}
	return http.StatusServiceUnavailable
}

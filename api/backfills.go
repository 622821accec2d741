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
)

// backfillRoutes registers /api/v1/backfills.
func (s *Server) backfillRoutes(rs *Routes) {
	rs.Handle("POST /api/v1/backfills", Mutate, s.startBackfill)
	rs.Handle("GET /api/v1/backfills", Read, s.listBackfills)
	rs.Handle("GET /api/v1/backfills/{id}", Read, s.showBackfill)
	rs.Handle("DELETE /api/v1/backfills/{id}", Mutate, s.cancelBackfill)
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
	if f := bytes.TrimSpace(body.Filter); len(f) > 0 && !bytes.Equal(f, []byte("null")) {
		if f[0] == '"' {
			if err := json.Unmarshal(f, &req.Filter); err != nil {
				WriteError(w, http.StatusBadRequest, fmt.Sprintf("filter: %v", err))
				return
			}
		} else {
			req.Filter = string(f)
		}
	}
	st, err := s.bfs.Start(context.WithoutCancel(r.Context()), s.gw.Config(), req)
	switch {
	case errors.Is(err, backfill.ErrInput):
		WriteError(w, http.StatusBadRequest, err.Error())
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

package app

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
func (g *gateway) startBackfill(w http.ResponseWriter, r *http.Request) {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	var body backfillBody
	if err := dec.Decode(&body); err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{fmt.Sprintf("body must be a JSON object {\"source\", \"sink\", \"filter\", \"rate\"}: %v", err)})
		return
	}
	req := backfill.Request{Source: body.Source, Sink: body.Sink, Rate: body.Rate}
	if f := bytes.TrimSpace(body.Filter); len(f) > 0 && !bytes.Equal(f, []byte("null")) {
		if f[0] == '"' {
			if err := json.Unmarshal(f, &req.Filter); err != nil {
				writeJSON(w, http.StatusBadRequest, apiError{fmt.Sprintf("filter: %v", err)})
				return
			}
		} else {
			req.Filter = string(f)
		}
	}
	st, err := g.backfills.Start(context.WithoutCancel(r.Context()), g.config(), req)
	switch {
	case errors.Is(err, backfill.ErrInput):
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	case errors.Is(err, backfill.ErrBusy):
		writeJSON(w, http.StatusConflict, apiError{err.Error()})
		return
	case err != nil:
		writeJSON(w, http.StatusServiceUnavailable, apiError{err.Error()})
		return
	}
	w.Header().Set("Location", "/api/v1/backfills/"+st.ID)
	writeJSON(w, http.StatusAccepted, st)
}

// listBackfills serves GET /api/v1/backfills: the backfills of this
// process (the running ones and the last finished), oldest first.
func (g *gateway) listBackfills(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"backfills": g.backfills.List()})
}

// showBackfill serves GET /api/v1/backfills/{id}.
func (g *gateway) showBackfill(w http.ResponseWriter, r *http.Request) {
	st, ok := g.backfills.Get(r.PathValue("id"))
	if !ok {
		writeJSON(w, http.StatusNotFound, apiError{fmt.Sprintf("no backfill %q in this process", r.PathValue("id"))})
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// cancelBackfill serves DELETE /api/v1/backfills/{id}: it stops reading
// and answers once the backfill ended (what was sent is delivered first),
// or after 20s with its current state.
func (g *gateway) cancelBackfill(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	st, err := g.backfills.Cancel(ctx, r.PathValue("id"))
	if errors.Is(err, backfill.ErrNotFound) {
		writeJSON(w, http.StatusNotFound, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, st)
}

package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/changegate/changegate/deadletter"
)

// deadLetterRoutes registers /api/v1/deadletters.
func (s *Server) deadLetterRoutes(rs *Routes) {
	rs.Handle("GET /api/v1/deadletters", ReadOwn, s.listDeadLetters)
	rs.Handle("GET /api/v1/deadletters/{id...}", ReadOwn, s.showDeadLetter)
	rs.Handle("POST /api/v1/deadletters/replay", Mutate, s.replayDeadLetters)
	rs.Handle("DELETE /api/v1/deadletters", Mutate, s.purgeDeadLetters)
}

// MaxPayloads bounds the whole entries read and rendered at once, by GET
// /api/v1/deadletters/{id} and the console's dead-letter page together.
const MaxPayloads = 2

// PayloadGate bounds the requests that hold a whole dead-letter entry in
// memory (up to a few times MongoDB's 16 MiB document limit each). Safe for
// concurrent use.
type PayloadGate struct {
	slots chan struct{}
	// Held, when set before the gate is used, runs while a slot is held
	// (tests).
	Held func()
	// inside and waiting count the requests holding a slot and those
	// waiting for one; most is the highest inside seen.
	inside, waiting, most atomic.Int64
}

// NewPayloadGate returns a gate of n slots.
func NewPayloadGate(n int) *PayloadGate {
	return &PayloadGate{slots: make(chan struct{}, n)}
}

// Enter waits for a slot; false when ctx ended first. A true Enter must be
// followed by Leave.
func (p *PayloadGate) Enter(ctx context.Context) bool {
	p.waiting.Add(1)
	select {
	case p.slots <- struct{}{}:
		p.waiting.Add(-1)
		n := p.inside.Add(1)
		for m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n); m = p.most.Load() {
		}
		if p.Held != nil {
			p.Held()
		}
		return true
	case <-ctx.Done():
		p.waiting.Add(-1)
		return false
	}
}

// Leave gives the slot of an Enter back.
func (p *PayloadGate) Leave() {
	p.inside.Add(-1)
	<-p.slots
}

// Counts returns the requests holding a slot now, those waiting for one,
// and the most that held one at once.
func (p *PayloadGate) Counts() (inside, waiting, most int64) {
	return p.inside.Load(), p.waiting.Load(), p.most.Load()
}

// listDeadLetters streams a page of dead-letter summaries (Page): memory
// stays bounded by one cursor batch of summaries whatever the entries'
// sizes. Entries are summaries (no change, no envelope: GET
// /api/v1/deadletters/{id} shows one in full); next is the after
// parameter of the next page.
func (s *Server) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	f, err := DeadLetterQueryOf(r).ListFilter(time.Now())
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	if p := PrincipalOf(r); p.Narrowed() {
		if f.Sink != "" && refuseSink(w, p, f.Sink) {
			return
		}
		f.SinkPrefix = p.Prefix
	}
	page := NewPage(w, "entries", f.Limit)
	err = s.dls.Summaries(r.Context(), f, page.Begin, func(e deadletter.Entry) error {
		b, err := e.MarshalJSON()
		if err != nil {
			return err
		}
		return page.Add(b, e.ID)
	})
	if err != nil && !page.Began() {
		code := http.StatusInternalServerError
		if errors.Is(err, deadletter.ErrNotFound) {
			code = http.StatusNotFound
		}
		WriteError(w, code, err.Error())
		return
	}
	page.End(err)
}

// showDeadLetter returns one entry in full (change and envelope included).
// At most MaxPayloads such replies are built at once, each up to a few
// times MongoDB's 16 MiB document limit.
func (s *Server) showDeadLetter(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.payloads.Enter(r.Context()) {
		return
	}
	defer s.payloads.Leave()
	e, ok, err := s.dls.Get(r.Context(), id)
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if !ok {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("no dead letter %q", id))
		return
	}
	if refuseSink(w, PrincipalOf(r), e.Sink) {
		return
	}
	WriteJSON(w, http.StatusOK, e)
}

// replayReport is the body of a replay's answer.
type replayReport struct {
	Replayed int      `json:"replayed"`
	Failed   int      `json:"failed"`
	Skipped  int      `json:"skipped"`
	Errors   []string `json:"errors,omitempty"`
}

func (s *Server) replayDeadLetters(w http.ResponseWriter, r *http.Request) {
	f, err := DeadLetterQueryOf(r).Filter(time.Now(), 0)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.ServeReplay(w, r, f)
}

// ServeReplay re-delivers the dead letters f selects (no kind: the failed
// ones; parked ones are refused) and answers with what it replayed.
// deliver_unrouted=true also delivers those no current rule routes to
// their sink. The admin API and the console share it.
func (s *Server) ServeReplay(w http.ResponseWriter, r *http.Request, f deadletter.Filter) {
	switch f.Kind {
	case "":
		f.Kind = deadletter.KindFailed
	case deadletter.KindParked:
		WriteError(w, http.StatusBadRequest, "parked entries are re-driven automatically, in order, once their sink accepts again; only failed entries can be replayed")
		return
	}
	var unrouted bool
	switch v := r.URL.Query().Get("deliver_unrouted"); v {
	case "", "false":
	case "true":
		unrouted = true
	default:
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("deliver_unrouted=%q: want true or false", v))
		return
	}
	// A replay waits for its deliveries (retries included): no write
	// deadline for it.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	res, err := s.gw.Replay(r.Context(), f, unrouted)
	rep := replayReport{Replayed: res.Replayed, Failed: res.Failed, Skipped: res.Skipped}
	for _, e := range res.Errors {
		rep.Errors = append(rep.Errors, e.Error())
	}
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
		WriteJSON(w, http.StatusInternalServerError, rep)
		return
	}
	WriteJSON(w, http.StatusOK, rep)
}

func (s *Server) purgeDeadLetters(w http.ResponseWriter, r *http.Request) {
	f, err := DeadLetterQueryOf(r).Filter(time.Now(), 0)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	// Judge the filter, not the parameters: limit=0 (no limit) or empty
	// values select everything too.
	everything := f.Sink == "" && f.Source == "" && f.Kind == "" && f.Since.IsZero() &&
		f.DocumentKey == nil && f.ExactDocumentKey == nil && f.Limit == 0 && f.AfterID == ""
	if everything && r.URL.Query().Get("all") != "true" {
		WriteError(w, http.StatusBadRequest, "refusing to purge every dead letter without a filter: add all=true to mean it")
		return
	}
	s.ServePurge(w, r, f)
}

// ServePurge deletes the dead letters f selects and answers how many. The
// admin API and the console share it (each refuses a selection of
// everything its own way first).
func (s *Server) ServePurge(w http.ResponseWriter, r *http.Request, f deadletter.Filter) {
	n, err := s.dls.Purge(r.Context(), f)
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	WriteJSON(w, http.StatusOK, map[string]int64{"purged": n})
}

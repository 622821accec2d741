package deliverylog

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
)

// Checkpoints lists the saved checkpoints; *checkpoint.Store is one.
type Checkpoints interface {
	List(ctx context.Context) ([]checkpoint.Checkpoint, error)
}

// DeadLetters reads entries by id; *deadletter.Store is one.
type DeadLetters interface {
	Get(ctx context.Context, id string) (deadletter.Entry, bool, error)
}

// State is where an event stands at one sink.
type State string

// The states of Lifecycle.
const (
	StateDelivered    State = "delivered"
	StateInFlight     State = "in_flight"
	StateRetrying     State = "retrying"
	StateParked       State = "parked"
	StateDeadLettered State = "dead_lettered"
	StateSkipped      State = "skipped"
)

// ErrNotFound is returned (wrapped) by Lifecycle for an event nothing is
// known of: no record, no entry, and no checkpoint to place it against.
var ErrNotFound = errors.New("event not found")

// Lifecycle is what became of one event at each sink it was routed to.
type Lifecycle struct {
	EventID string `json:"id"`
	Source  string `json:"source"`
	// ClusterTime is the change's cluster time, read from its id (nil for
	// an event whose id holds none: snapshot and backfill events).
	ClusterTime *time.Time `json:"cluster_time,omitempty"`
	// Acknowledged says whether every checkpoint of the source is past
	// the event (every sink finished with it: delivered, dead-lettered,
	// parked or skipped); nil when that cannot be told.
	Acknowledged *bool           `json:"acknowledged"`
	Sinks        []SinkLifecycle `json:"sinks"`
	// Covers says what the answer rests on and what it cannot see.
	Covers []string `json:"covers"`
}

// SinkLifecycle is the event at one sink.
type SinkLifecycle struct {
	Sink  string   `json:"sink"`
	Rules []string `json:"rules,omitempty"`
	State State    `json:"state"`
	// Derived: the state was not recorded but derived from the checkpoint
	// and the dead-letter store (Note says how).
	Derived  bool      `json:"derived,omitempty"`
	Note     string    `json:"note,omitempty"`
	Attempts []Attempt `json:"attempts"`
	// DeadLetter and Parked link the event's entry in the dead-letter
	// store, when there is one.
	DeadLetter *Link `json:"dead_letter,omitempty"`
	Parked     *Link `json:"parked,omitempty"`
}

// Link names an entry of the dead-letter store and its API path.
type Link struct {
	ID   string `json:"id"`
	Href string `json:"href"`
}

func entryLink(id string) *Link {
	return &Link{ID: id, Href: "/api/v1/deadletters/" + url.PathEscape(id)}
}

// Attempt is one record of a lifecycle.
type Attempt struct {
	At         time.Time `json:"at"`
	Attempt    int       `json:"attempt"`
	Outcome    Outcome   `json:"outcome"`
	Status     int       `json:"status,omitempty"`
	Code       string    `json:"code,omitempty"`
	ErrorClass string    `json:"error_class,omitempty"`
	Error      string    `json:"error,omitempty"`
	DurationMS float64   `json:"duration_ms"`
	Response   string    `json:"response,omitempty"`
	Replica    string    `json:"replica,omitempty"`
	Unit       string    `json:"unit,omitempty"`
	TraceID    string    `json:"trace_id,omitempty"`
	Redelivery string    `json:"redelivery,omitempty"`
	// Batch is the number of events of the request, when it was a batch.
	Batch int `json:"batch,omitempty"`
}

func attemptOf(r *Record) Attempt {
	a := Attempt{At: r.Time, Attempt: r.Attempt, Outcome: r.Outcome, Status: r.Status, Code: r.Code,
		ErrorClass: r.ErrorClass, Error: r.Error, DurationMS: durationMS(r.Duration), Response: r.Response,
		Replica: r.Replica, Unit: r.Unit, TraceID: r.TraceID, Redelivery: r.Redelivery}
	if r.BatchIDs != nil {
		a.Batch = len(r.BatchIDs)
	}
	return a
}

// maxLifecycleRecords bounds the records one Lifecycle reads.
const maxLifecycleRecords = 1000

// acknowledged reports whether every checkpoint of source's units is at
// or past the resume token data (they sort in stream order, DOCS-11616),
// and whether that could be told: no checkpoint, a partitioned source
// with a partition missing, or a checkpoint holding an initial snapshot
// in progress cannot tell.
func acknowledged(cps []checkpoint.Checkpoint, source, data string) (acked, known bool) {
	var units []checkpoint.Checkpoint
	parts := map[int]map[int]bool{} // N -> partitions seen
	for _, cp := range cps {
		if cp.Source == source {
			units = append(units, cp)
			continue
		}
		rest, ok := strings.CutPrefix(cp.Source, source+"#")
		if !ok {
			continue
		}
		i, n, ok := strings.Cut(rest, "/")
		pi, err1 := strconv.Atoi(i)
		pn, err2 := strconv.Atoi(n)
		if !ok || err1 != nil || err2 != nil {
			continue
		}
		if parts[pn] == nil {
			parts[pn] = map[int]bool{}
		}
		parts[pn][pi] = true
		units = append(units, cp)
	}
	for n, seen := range parts {
		if len(seen) != n {
			return false, false
		}
	}
	if len(units) == 0 {
		return false, false
	}
	acked = true
	for _, cp := range units {
		if cp.Snapshot != nil {
			return false, false
		}
		if strings.ToUpper(event.TokenData(cp.Token)) < strings.ToUpper(data) {
			acked = false
		}
	}
	return acked, true
}

// Lifecycle returns what became of the event with id at each sink: the
// sinks its records and dead-letter entries name, and those Deps.Routes
// gives for its source, each with its attempts in time order and a state.
// A state not recorded is derived, and marked so: from the dead-letter
// store (parked, dead-lettered) and from the source's checkpoints (past
// the event and nothing failed or pending: delivered).
func (l *Log) Lifecycle(ctx context.Context, id string) (Lifecycle, error) {
	source, data, ok := event.SplitID(id)
	if !ok {
		return Lifecycle{}, fmt.Errorf("%w: event id %q: expected <source>:<resume token>", ErrBadFilter, id)
	}
	lc := Lifecycle{EventID: id, Source: source, Sinks: []SinkLifecycle{}}
	ct, streamEvent := event.DataClusterTime(data)
	if streamEvent {
		t := time.Unix(int64(ct.T), 0).UTC()
		lc.ClusterTime = &t
	}

	cur, err := l.coll.Find(ctx, bson.D{{Key: "event_ids", Value: bson.D{{Key: "$eq", Value: id}}}},
		options.Find().SetSort(bson.D{{Key: "at", Value: 1}, {Key: "_id", Value: 1}}).SetLimit(maxLifecycleRecords))
	if err != nil {
		return Lifecycle{}, fmt.Errorf("delivery log: lifecycle %s: %w", id, err)
	}
	var docs []stored
	if err := cur.All(ctx, &docs); err != nil {
		return Lifecycle{}, fmt.Errorf("delivery log: lifecycle %s: %w", id, err)
	}
	if len(docs) == maxLifecycleRecords {
		lc.Covers = append(lc.Covers, fmt.Sprintf("the first %d records only", maxLifecycleRecords))
	}

	bySink := map[string]*SinkLifecycle{}
	var order []string
	sinkOf := func(name string) *SinkLifecycle {
		s := bySink[name]
		if s == nil {
			s = &SinkLifecycle{Sink: name, Attempts: []Attempt{}}
			bySink[name] = s
			order = append(order, name)
		}
		return s
	}
	last := map[string]Outcome{}
	for i := range docs {
		r := docs[i].record()
		s := sinkOf(r.Sink)
		for _, rule := range r.Rules {
			if !contains(s.Rules, rule) {
				s.Rules = append(s.Rules, rule)
			}
		}
		s.Attempts = append(s.Attempts, attemptOf(&r))
		last[r.Sink] = r.Outcome
	}
	routed := false
	if l.deps.Routes != nil {
		routed = true
		for _, rt := range l.deps.Routes(source) {
			s := sinkOf(rt.Sink)
			if s.Rules == nil {
				s.Rules = slices.Clone(rt.Rules)
			}
		}
	}

	var acked, known bool
	if l.deps.Checkpoints != nil && streamEvent {
		cps, err := l.deps.Checkpoints.List(ctx)
		if err != nil {
			return Lifecycle{}, fmt.Errorf("delivery log: lifecycle %s: checkpoints: %w", id, err)
		}
		acked, known = acknowledged(cps, source, data)
	}
	if known {
		lc.Acknowledged = &acked
	}
	entries := map[string]deadletter.Entry{}
	if l.deps.DeadLetters != nil {
		for _, name := range order {
			e, found, err := l.deps.DeadLetters.Get(ctx, deadletter.EntryID(id, name))
			if err != nil {
				return Lifecycle{}, fmt.Errorf("delivery log: lifecycle %s: %w", id, err)
			}
			if found {
				entries[name] = e
			}
		}
	}

	for _, name := range order {
		s := bySink[name]
		e, hasEntry := entries[name]
		lastOutcome, recorded := last[name]
		switch {
		case hasEntry && e.Kind == deadletter.KindFailed:
			s.State, s.DeadLetter = StateDeadLettered, entryLink(e.ID)
			s.Derived = !recorded || lastOutcome != OutcomeDeadLettered
		case hasEntry && e.Kind == deadletter.KindParked:
			s.State, s.Parked = StateParked, entryLink(e.ID)
			s.Derived = !recorded || lastOutcome != OutcomeParked
		case recorded && lastOutcome == OutcomeDelivered:
			s.State = StateDelivered
		case recorded && lastOutcome == OutcomeSkipped:
			s.State = StateSkipped
		case recorded && lastOutcome == OutcomeDeadLettered:
			s.State = StateDeadLettered
			if l.deps.DeadLetters != nil {
				s.Derived, s.Note = true, "its dead letter is no longer stored: replayed or purged"
			}
		case recorded && lastOutcome == OutcomeParked && l.deps.DeadLetters == nil && !(known && acked):
			s.State = StateParked
		case known && acked:
			s.State, s.Derived = StateDelivered, true
			switch {
			case recorded && lastOutcome == OutcomeParked:
				s.Note = "re-driven from its parked entry: the checkpoint is past it and the entry is gone"
			case recorded:
				s.Note = "the checkpoint is past it and nothing failed or is pending for this sink"
			default:
				s.Note = "not recorded: the checkpoint is past it and nothing failed or is pending for this sink (delivered if its rules matched the change)"
			}
		case recorded && (lastOutcome == OutcomeRetrying || lastOutcome == OutcomeFailed):
			s.State = StateRetrying
		case recorded || known:
			s.State, s.Derived = StateInFlight, !recorded || lastOutcome != OutcomeAbandoned
			if !recorded {
				s.Note = "not recorded: the checkpoint is not past it yet (in flight if its rules matched the change)"
			}
		default:
			continue // nothing tells: not listed
		}
		lc.Sinks = append(lc.Sinks, *s)
	}
	if len(docs) == 0 && len(entries) == 0 && !known {
		return Lifecycle{}, fmt.Errorf("%w: %s: no record, no dead letter or parked entry, and no checkpoint of source %q to place it against", ErrNotFound, id, source)
	}

	lc.Covers = append(lc.Covers, l.lifecycleCovers(routed, streamEvent, known, lc.ClusterTime)...)
	return lc, nil
}

func (l *Log) lifecycleCovers(routed, streamEvent, known bool, ct *time.Time) []string {
	var c []string
	switch l.mode {
	case config.DeliveryLogAll:
		c = append(c, `mode "all": every attempt is recorded (unless dropped when MongoDB did not keep up)`)
	default:
		c = append(c, `mode "failures": successful attempts are not recorded; "delivered" without a record is derived from the checkpoint`)
	}
	if !routed {
		c = append(c, "sinks without a record or an entry are not listed")
	}
	if !streamEvent {
		c = append(c, "the id holds no stream position (a snapshot or backfill event): states come from records and entries only")
	} else if !known {
		c = append(c, "no checkpoint of the source places the event: states come from records and entries only")
	}
	if ct != nil && l.retention > 0 && time.Since(*ct) > l.retention {
		c = append(c, fmt.Sprintf("the change is older than the log's retention (%s): its records may have expired", l.retention))
	}
	return c
}

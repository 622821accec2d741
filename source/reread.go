package source

// Reading the oplog again: the changes of a source's stream from a cluster
// time on, for a redelivery (package backfill). The stream is opened as the
// Source opens it (open), nothing is tracked, dispatched or checkpointed.

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/event"
)

// Reread reads the changes of spec's stream again from startAt on (opened
// with startAtOperationTime: every change at or after it), as a Source
// running spec opens its stream: the state database left out of a
// whole-cluster stream, the unit's partition when spec.Partitions > 1, the
// rules' pushdown when spec.Pushdown is set, the configured pipeline, and
// large changes split by the server and reassembled. It calls fn with each
// change read (ev, built by event.FromChange, with ev.Mem its charge of
// spec.Budget, released when fn returns: fn retains it to keep it) and with
// ev nil whenever the stream answered that nothing more was there for now
// (at: the cluster time of its post-batch resume token). fn returns false
// to stop; Reread then returns nil. Nothing is checkpointed.
//
// It returns an error wrapping ErrHistoryLost when the server no longer
// holds startAt in its oplog (code 286), fn's error, or the stream's.
func Reread(ctx context.Context, client *mongo.Client, spec Spec, startAt bson.Timestamp, fn func(ev *event.Event, at bson.Timestamp) (bool, error)) error {
	s := New(spec, client, nil, nil, nil, nil, nil)
	for {
		err := s.reread(ctx, startAt, fn)
		if s.spec.Partitions > 1 && !s.clientFilter && isUnsupportedHash(err) {
			s.clientFilter = true // filter the partition here (mine)
			continue
		}
		return err
	}
}

func (s *Source) reread(ctx context.Context, startAt bson.Timestamp, fn func(ev *event.Event, at bson.Timestamp) (bool, error)) error {
	cs, err := s.open(ctx, nil, &startAt, false)
	if err != nil {
		if isHistoryLost(err) {
			return fmt.Errorf("%w: MongoDB no longer keeps cluster time %d.%d in its oplog: %v", ErrHistoryLost, startAt.T, startAt.I, err)
		}
		return err
	}
	defer func() { _ = cs.Close(context.WithoutCancel(ctx)) }()
	var frags fragments
	// The first empty TryNext only consumes the aggregate's first batch;
	// a later one got an answer to a getMore with nothing in it.
	empty := 0
	for {
		if got, _ := s.tryNext(ctx, cs); !got {
			if err := cs.Err(); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if isHistoryLost(err) {
					return fmt.Errorf("%w: MongoDB no longer keeps cluster time %d.%d in its oplog: %v", ErrHistoryLost, startAt.T, startAt.I, err)
				}
				return err
			}
			if cs.ID() == 0 {
				return errors.New("change stream closed by the server (invalidated) while reading it again")
			}
			if empty++; empty < 2 || frags.pending() {
				continue
			}
			at, _ := event.TokenClusterTime(cs.ResumeToken())
			more, err := fn(nil, at)
			if err != nil || !more {
				return err
			}
			continue
		}
		whole, err := frags.add(cs.Current)
		if err != nil {
			return err
		}
		if whole == nil {
			continue // more fragments to come
		}
		raw := make(bson.Raw, len(whole))
		copy(raw, whole)
		ev, err := event.FromChange(s.spec.Name, 0, raw)
		if err != nil {
			return fmt.Errorf("malformed change event: %w", err)
		}
		if !s.mine(ev) {
			continue
		}
		mem, err := s.spec.Budget.Acquire(ctx, int64(len(raw)), "redelivery of "+s.spec.Name)
		if err != nil {
			return err
		}
		ev.Mem = mem
		more, err := fn(ev, ev.ClusterTime)
		mem.Release()
		if err != nil || !more {
			return err
		}
	}
}

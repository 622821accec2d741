package deadletter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/changegate/changegate/lease"
)

// This file fences the writes of a unit's entries by its lease epoch: Fence,
// and the transaction that checks the unit's guard document before a Put or
// PutMany of entries with an Epoch.

// ErrFenced is returned (wrapped) by Put and PutMany when an entry's Epoch
// is below its unit's fence (a newer owner of the unit took it over), and by
// Fence when the unit is fenced by a higher epoch already. Nothing is
// written then.
var ErrFenced = errors.New("unit claimed by a newer lease epoch")

// Fence claims unit for lease epoch (> 0) in the store: from then on, writes
// of entries of unit with an older Epoch are refused (ErrFenced) by the
// store itself. The new owner of a unit fences it before it re-drives or
// writes anything of it, as it fences the unit's checkpoint.
func (s *Store) Fence(ctx context.Context, unit string, epoch int64) error {
	if epoch <= 0 {
		return fmt.Errorf("dead letters: fence %s: epoch %d is not positive", unit, epoch)
	}
	if err := s.raiseFence(ctx, unit, epoch); err != nil {
		return fmt.Errorf("dead letters: fence %s with epoch %d: %w", unit, epoch, err)
	}
	return nil
}

// raiseFence sets unit's fence to epoch unless it is higher (ErrFenced). It
// always writes the guard document (a counter), so that in a transaction it
// conflicts with a concurrent Fence.
func (s *Store) raiseFence(ctx context.Context, unit string, epoch int64) error {
	_, err := s.fences.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: unit}, lease.EpochGuard("epoch", epoch)},
		bson.D{{Key: "$set", Value: bson.D{{Key: "epoch", Value: epoch}}}, {Key: "$inc", Value: bson.D{{Key: "writes", Value: int64(1)}}}},
		options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return ErrFenced // the guard holds a higher epoch: the upsert collided
	}
	return err
}

// FencedWriteAttempt bounds one attempt of a fenced write (Put, PutMany of
// entries with an Epoch): its transaction, retries of transient errors
// included. Past it the write fails with the context's error (nothing is
// written) and may be retried.
var FencedWriteAttempt = 30 * time.Second

// fenced runs write in a transaction that first checks (and writes) the
// fence of every unit of es: if one holds a higher epoch than its entries',
// the transaction is aborted and nothing is written. A concurrent Fence
// conflicts with the transaction's write of the guard, so a refused write
// is refused by MongoDB at the moment it would apply, however long the
// request was delayed on its way.
func (s *Store) fenced(ctx context.Context, es []Entry, write func(context.Context) error) error {
	type guard struct {
		unit  string
		epoch int64
	}
	var guards []guard
	for _, e := range es {
		if e.Epoch <= 0 {
			continue
		}
		unit := e.Unit
		if unit == "" {
			unit = e.Source
		}
		g := guard{unit, e.Epoch}
		if !slices.Contains(guards, g) {
			guards = append(guards, g)
		}
	}
	// One fenced write per unit at a time in this process, units locked
	// in order (a write of several units cannot deadlock with another).
	// The wait for the lock is not part of the attempt's bound below: it
	// ends with ctx (the caller's: its tenure, a stop), however many
	// writes of the unit queue before this one.
	slices.SortFunc(guards, func(a, b guard) int { return strings.Compare(a.unit, b.unit) })
	for i, g := range guards {
		if i > 0 && guards[i-1].unit == g.unit {
			continue
		}
		unlock, err := s.lockUnit(ctx, g.unit)
		if err != nil {
			return err
		}
		defer unlock()
	}
	// The attempt (its transaction) is bounded: a transaction left open
	// by a replica that was killed, paused or cut off mid-write holds the
	// unit's guard document until MongoDB aborts it
	// (transactionLifetimeLimitSeconds, 60 s by default), and every
	// attempt meanwhile fails with WriteConflict, which the driver's
	// WithTransaction retries for up to 120 s. The caller retries (and
	// logs) instead, with a new session.
	ctx, cancel := context.WithTimeout(ctx, FencedWriteAttempt)
	defer cancel()
	sess, err := s.coll.Database().Client().StartSession()
	if err != nil {
		return err
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		for _, g := range guards {
			if err := s.raiseFence(ctx, g.unit, g.epoch); err != nil {
				return nil, err
			}
		}
		return nil, write(ctx)
	}, options.Transaction().SetWriteConcern(writeconcern.Majority()))
	return err
}

// lockUnit takes unit's fenced-write lock, or returns ctx's error.
func (s *Store) lockUnit(ctx context.Context, unit string) (func(), error) {
	s.guardMu.Lock()
	if s.guards == nil {
		s.guards = map[string]chan struct{}{}
	}
	l, ok := s.guards[unit]
	if !ok {
		l = make(chan struct{}, 1)
		s.guards[unit] = l
	}
	s.guardMu.Unlock()
	select {
	case l <- struct{}{}:
		return func() { <-l }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

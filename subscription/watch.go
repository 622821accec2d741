package subscription

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// DefaultWatchInterval is how often Watch polls: a change is seen by every
// replica within it (plus one read).
const DefaultWatchInterval = time.Second

// version identifies one stored state of a subscription: a deleted and
// re-created subscription starts at revision 1 again, with a new creation
// time.
type version struct {
	rev     int64
	created time.Time
}

// Watch follows the stored subscriptions until ctx ends: it calls apply
// with all of them (in name order) once at the start and again whenever
// one is created, changed or deleted, and when a rotated-out secret's
// overlap ends (so that the set of signing secrets is current). It polls
// every interval (0: DefaultWatchInterval; at most 1s is sensible) with a
// read of each document's revision alone, and reads the documents only
// when something changed. A failed read is logged (once until it
// succeeds again) and retried at the next poll; apply keeps the last set
// meanwhile. apply runs on Watch's goroutine, one call at a time. Watch
// returns ctx's error.
func (s *Store) Watch(ctx context.Context, interval time.Duration, apply func([]Subscription)) error {
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	var (
		last      map[string]version
		nextAt    time.Time // the next overlap end, zero if none
		lastError string
	)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		t.Reset(interval)
		cur, err := s.versions(ctx)
		if err == nil && (last == nil || !sameVersions(last, cur) || !nextAt.IsZero() && !s.now().Before(nextAt)) {
			var subs []Subscription
			if subs, err = s.All(ctx); err == nil {
				// last is what the poll read: a document this release cannot
				// read (left out of subs) does not make every poll re-read.
				now := s.now()
				nextAt = time.Time{}
				for i := range subs {
					if e := subs[i].nextExpiry(now); !e.IsZero() && (nextAt.IsZero() || e.Before(nextAt)) {
						nextAt = e
					}
				}
				last = cur
				apply(subs)
			}
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil && err.Error() != lastError:
			lastError = err.Error()
			s.log.Warn("subscriptions: reading the stored subscriptions failed; the last ones read stay applied", "err", err)
		case err == nil && lastError != "":
			lastError = ""
			s.log.Info("subscriptions: reading the stored subscriptions works again")
		}
	}
}

// versions reads each subscription's revision and creation time.
func (s *Store) versions(ctx context.Context) (map[string]version, error) {
	cur, err := s.subs.Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "rev", Value: 1}, {Key: "created.at", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("subscriptions: poll: %w", err)
	}
	defer cur.Close(ctx)
	out := map[string]version{}
	for cur.Next(ctx) {
		var r struct {
			Name    string `bson:"_id"`
			Rev     int64  `bson:"rev"`
			Created struct {
				At time.Time `bson:"at"`
			} `bson:"created"`
		}
		if err := cur.Decode(&r); err != nil {
			return nil, fmt.Errorf("subscriptions: poll: %w", err)
		}
		out[r.Name] = version{r.Rev, r.Created.At.UTC()}
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("subscriptions: poll: %w", err)
	}
	return out, nil
}

func sameVersions(a, b map[string]version) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !w.created.Equal(v.created) || w.rev != v.rev {
			return false
		}
	}
	return true
}

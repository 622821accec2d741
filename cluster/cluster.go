// Package cluster decides how changegate replicas share the units of work
// (sources, or partitions of them) whose leases live in MongoDB (package
// lease): who is a live member, and which units a replica should acquire
// or hand over so that each owns at most its fair share.
//
// # Membership
//
// Every replica keeps a heartbeat document {_id: "member/<instance>",
// owner, expires} in the leases collection, written with the same update
// pipeline technique as leases, so expires is the server's $$NOW plus the
// lease ttl. A member is live while its expiry has not passed, judged by
// the server ($expr with $$NOW). A replica that stops cleanly expires its
// document at once (Leave); one that dies drops out after a ttl.
//
// # Balance
//
// With U units and M live members, a replica's fair share is ceil(U/M).
// Each round (every renew_every) a replica renews what it owns, then:
// with more than its share it hands the surplus over (stop reading, drain,
// save the checkpoint, release the lease); with less it acquires free or
// expired units up to its share (Plan). Joining or leaving therefore
// rebalances within about two rounds once the membership is seen.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// MemberPrefix starts the _id of every member heartbeat document; lease
// documents (whose _id is a unit name) never start with it.
const MemberPrefix = "member/"

// FairShare is the most units one of members live replicas should own:
// ceil(units/members), at least 1 when there are units.
func FairShare(units, members int) int {
	if units == 0 {
		return 0
	}
	members = max(members, 1)
	return (units + members - 1) / members
}

// Plan is what a replica does in one round.
type Plan struct {
	// Acquire lists the units to try to acquire, in order; acquisition
	// may fail (another replica was faster), so the caller stops once it
	// owns its share.
	Acquire []string
	// Release lists owned units to hand over: the surplus above the share.
	Release []string
}

// Decide plans one round for replica self: units are every unit of the
// configuration, owned those it holds, free those nobody holds (no lease,
// or an expired or released one), members the live members (self
// included), and counts the units each live member holds now (self's own
// count is len(owned)). Each replica owns at most ceil(U/M) units; the
// surplus is handed over from the end of the sorted owned list. And every
// live replica should own at least floor(U/M): while one owns fewer, the
// others leave it the units that just became free (fresh: free now, held
// in the previous round) and take only those free for longer (so a unit is
// never left without an owner for more than a round), and when none is
// free, the replica with the greatest name among those at the ceiling
// releases one (4 units on 3 replicas: 2/2/0 becomes 2/1/1). Candidates are tried starting at a place
// that depends on self, so that replicas starting together do not all race
// for the same unit first.
func Decide(self string, units, owned, free, members []string, counts map[string]int, fresh map[string]bool) Plan {
	share := FairShare(len(units), len(members))
	floor := len(units) / max(len(members), 1)
	var p Plan
	o := slices.Clone(owned)
	slices.Sort(o)
	if len(o) > share {
		p.Release = o[share:]
		return p
	}
	starved := false // another live member below the floor
	var top string   // the greatest name among members at the ceiling
	for _, m := range members {
		n := counts[m]
		if m == self {
			n = len(o)
		}
		if m != self && n < floor {
			starved = true
		}
		if n == share && share > floor && m > top {
			top = m
		}
	}
	c := slices.Clone(free)
	slices.Sort(c)
	c = slices.DeleteFunc(c, func(u string) bool { _, found := slices.BinarySearch(o, u); return found })
	if starved && len(o) >= floor {
		if len(c) == 0 && top == self && len(o) > 0 {
			p.Release = o[len(o)-1:]
			return p
		}
		// Leave what just became free to the starved member.
		c = slices.DeleteFunc(c, func(u string) bool { return fresh[u] })
	}
	want := share - len(o)
	if want == 0 || len(c) == 0 {
		return p
	}
	h := fnv.New32a()
	h.Write([]byte(self))
	start := int(h.Sum32() % uint32(len(c)))
	p.Acquire = append(c[start:], c[:start]...)
	return p
}

// Members keeps this replica's heartbeat and counts the live members. It
// is safe for concurrent use.
type Members struct {
	coll     *mongo.Collection
	instance string
	ttl      time.Duration
}

// NewMembers returns the membership of instance in db.collection (the
// leases collection), with heartbeats lasting ttl.
func NewMembers(db *mongo.Database, collection, instance string, ttl time.Duration) *Members {
	return &Members{
		coll: db.Collection(collection, options.Collection().
			SetWriteConcern(writeconcern.Majority()).
			SetReadConcern(readconcern.Majority())),
		instance: instance, ttl: ttl,
	}
}

type memberRecord struct {
	ID      string    `bson:"_id"`
	Owner   string    `bson:"owner"`
	Expires time.Time `bson:"expires"`
}

// Heartbeat extends this replica's membership by the ttl, in the server's
// clock. It returns the server's time of the write (expires minus ttl), so
// the caller can judge other expiries without trusting its own clock.
func (m *Members) Heartbeat(ctx context.Context) (time.Time, error) {
	update := mongo.Pipeline{{{Key: "$set", Value: bson.D{
		{Key: "owner", Value: m.instance},
		{Key: "expires", Value: bson.D{{Key: "$add", Value: bson.A{"$$NOW", m.ttl.Milliseconds()}}}},
	}}}}
	var r memberRecord
	err := m.coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: MemberPrefix + m.instance}}, update,
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&r)
	if err != nil {
		return time.Time{}, fmt.Errorf("cluster: heartbeat of %s: %w", m.instance, err)
	}
	return r.Expires.Add(-m.ttl), nil
}

// Live returns the instances whose membership has not expired, in the
// server's judgement, sorted.
func (m *Members) Live(ctx context.Context) ([]string, error) {
	filter := bson.D{
		{Key: "_id", Value: bson.D{{Key: "$regex", Value: "^" + MemberPrefix}}},
		{Key: "$expr", Value: bson.D{{Key: "$gte", Value: bson.A{"$expires", "$$NOW"}}}},
	}
	cur, err := m.coll.Find(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("cluster: list members: %w", err)
	}
	var rs []memberRecord
	if err := cur.All(ctx, &rs); err != nil {
		return nil, fmt.Errorf("cluster: list members: %w", err)
	}
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, strings.TrimPrefix(r.ID, MemberPrefix))
	}
	slices.Sort(out)
	return out, nil
}

// Leave expires this replica's membership at once, so the others count it
// out before the ttl passes. The document stays (it is tiny, and the next
// start under the same instance name reuses it).
func (m *Members) Leave(ctx context.Context) error {
	update := mongo.Pipeline{{{Key: "$set", Value: bson.D{
		{Key: "expires", Value: bson.D{{Key: "$subtract", Value: bson.A{"$$NOW", int64(1)}}}},
	}}}}
	_, err := m.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: MemberPrefix + m.instance}}, update)
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return fmt.Errorf("cluster: leave %s: %w", m.instance, err)
	}
	return nil
}

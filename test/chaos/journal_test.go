package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// change is one change the writer made to a document. seq is the
// document's seq field after the change (for a delete: before it, the
// deleted version's seq); a document's seq only grows, across deletes and
// re-inserts, so (seq, delete) identifies a change of a document.
type change struct {
	Seq    int64
	Op     string // insert, update, replace or delete
	Global int    // the writer's change counter (the g field)
	At     time.Time
}

// key orders a document's changes: a delete comes after the change that
// wrote its seq and before the re-insert that writes seq+1.
func (c change) key() int64 {
	if c.Op == "delete" {
		return 2*c.Seq + 1
	}
	return 2 * c.Seq
}

// String names the change as the reports do: "update 18", "delete of 7".
func (c change) String() string {
	if c.Op == "delete" {
		return fmt.Sprintf("delete of %d", c.Seq)
	}
	return fmt.Sprintf("%s %d", c.Op, c.Seq)
}

// journal is what the writer did: for each document (by _id), its changes in
// the order they were made. Written by one goroutine, read after it ends.
type journal struct {
	docs  map[int32][]change
	total int
}

// workload describes the writer's job.
type workload struct {
	docs    int     // documents
	changes int     // changes in total, the first inserts included
	rate    float64 // changes per second
}

// write runs the workload against coll, recording every acknowledged change.
// Each update $incs the document's seq and sets g to the global counter;
// replaces carry the next seq; deletes are followed, when the document is
// picked again, by a re-insert with the next seq. It stops at the first error.
func (w workload) write(ctx context.Context, rng *rand.Rand, coll *mongo.Collection) (*journal, error) {
	j := &journal{docs: map[int32][]change{}}
	seq := make([]int64, w.docs)
	deleted := make([]bool, w.docs)
	interval := time.Duration(float64(time.Second) / w.rate)
	t0 := time.Now()
	for i := 0; i < w.changes; i++ {
		if d := time.Until(t0.Add(time.Duration(i) * interval)); d > 0 {
			select {
			case <-ctx.Done():
				return j, ctx.Err()
			case <-time.After(d):
			}
		}
		var id int32
		var op string
		if i < w.docs {
			id, op = int32(i), "insert"
		} else {
			id = int32(rng.IntN(w.docs))
			switch r := rng.IntN(100); {
			case deleted[id]:
				op = "insert"
			case r < 75:
				op = "update"
			case r < 90:
				op = "replace"
			default:
				op = "delete"
			}
		}
		var err error
		c := change{Op: op, Global: i}
		switch op {
		case "insert":
			seq[id]++
			_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "seq", Value: seq[id]}, {Key: "g", Value: int64(i)}})
			deleted[id] = false
		case "update":
			seq[id]++
			_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{
				{Key: "$inc", Value: bson.D{{Key: "seq", Value: int64(1)}}},
				{Key: "$set", Value: bson.D{{Key: "g", Value: int64(i)}}},
			})
		case "replace":
			seq[id]++
			_, err = coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "_id", Value: id}, {Key: "seq", Value: seq[id]}, {Key: "g", Value: int64(i)}, {Key: "replaced", Value: true}})
		case "delete":
			_, err = coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}})
			deleted[id] = true
		}
		if err != nil {
			return j, fmt.Errorf("change %d (%s of %d): %w", i, op, id, err)
		}
		c.Seq, c.At = seq[id], time.Now()
		j.docs[id] = append(j.docs[id], c)
		j.total++
	}
	return j, nil
}

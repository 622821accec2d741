package backfill

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A backfill_runs record of the release before redeliveries (no kind, no
// window, no oplog position) still resumes as a backfill of documents from
// its saved _id; a redelivery's record resumes as one, after its position.
func TestRecordResumeFormats(t *testing.T) {
	old, _ := bson.Marshal(bson.D{{Key: "_id", Value: "a1"}, {Key: "source", Value: "items"}, {Key: "sink", Value: "b"},
		{Key: "rate", Value: 100.0}, {Key: "state", Value: "running"}, {Key: "namespace", Value: "db.items"}, {Key: "after", Value: 42},
		{Key: "scanned", Value: int64(7)}, {Key: "startedAt", Value: time.Unix(1, 0)}, {Key: "updatedAt", Value: time.Unix(2, 0)}})
	var rec record
	if err := bson.Unmarshal(old, &rec); err != nil {
		t.Fatal(err)
	}
	req, rs := rec.resume()
	if req.Kind != "" || !req.Since.IsZero() || rs.afterCT.T != 0 || rs.namespace != "db.items" || rs.after.Lookup("_id").Int32() != 42 || rs.scanned != 7 {
		t.Errorf("old record resumes as %+v %+v", req, rs)
	}
	since, until := time.Unix(100, 0).UTC(), time.Unix(200, 0).UTC()
	red, _ := bson.Marshal(bson.D{{Key: "_id", Value: "r1"}, {Key: "source", Value: "items"}, {Key: "sink", Value: "b"},
		{Key: "rate", Value: 100.0}, {Key: "state", Value: "running"}, {Key: "kind", Value: KindRedelivery}, {Key: "since", Value: since},
		{Key: "until", Value: until}, {Key: "afterClusterTime", Value: bson.Timestamp{T: 150, I: 3}}, {Key: "afterToken", Value: "82AB"},
		{Key: "scanned", Value: int64(9)}})
	rec = record{}
	if err := bson.Unmarshal(red, &rec); err != nil {
		t.Fatal(err)
	}
	req, rs = rec.resume()
	if req.Kind != KindRedelivery || !req.Since.Equal(since) || !req.Until.Equal(until) || rs.afterCT != (bson.Timestamp{T: 150, I: 3}) || rs.afterData != "82AB" {
		t.Errorf("redelivery record resumes as %+v %+v", req, rs)
	}
}

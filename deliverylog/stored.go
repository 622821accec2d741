package deliverylog

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// stored is the document of a record (see Record for the field names).
type stored struct {
	ID          bson.ObjectID  `bson:"_id"`
	At          time.Time      `bson:"at"`
	EventIDs    []string       `bson:"event_ids"`
	Events      int            `bson:"events"`
	Source      string         `bson:"source"`
	DB          string         `bson:"db,omitempty"`
	Coll        string         `bson:"coll,omitempty"`
	Operation   string         `bson:"op,omitempty"`
	Keys        []bson.Raw     `bson:"keys,omitempty"`
	Sink        string         `bson:"sink"`
	Rules       []string       `bson:"rules,omitempty"`
	Attempt     int            `bson:"attempt"`
	Outcome     Outcome        `bson:"outcome"`
	Status      int            `bson:"status,omitempty"`
	Code        string         `bson:"code,omitempty"`
	ErrorClass  string         `bson:"class,omitempty"`
	Error       string         `bson:"error,omitempty"`
	DurationMS  float64        `bson:"duration_ms"`
	LatBucket   int            `bson:"lat_bucket"`
	Response    string         `bson:"response,omitempty"`
	TraceID     string         `bson:"trace_id,omitempty"`
	Redelivery  string         `bson:"redelivery,omitempty"`
	Replica     string         `bson:"replica,omitempty"`
	Unit        string         `bson:"unit,omitempty"`
	Epoch       int64          `bson:"epoch,omitempty"`
	ClusterTime bson.Timestamp `bson:"cluster_time,omitempty"`
}

// store returns the document of r, sanitizing what came from outside (the
// receiver's answer, the error message).
func (r *Record) store(replica string) stored {
	s := stored{
		ID: bson.NewObjectID(), At: r.Time.UTC(), EventIDs: r.IDs(), Events: r.Events(),
		Source: r.Source, DB: r.DB, Coll: r.Coll, Operation: r.Operation, Sink: r.Sink, Rules: r.Rules,
		Attempt: r.Attempt, Outcome: r.Outcome, Status: r.Status, Code: r.Code, ErrorClass: r.ErrorClass,
		Error: printable([]byte(r.Error), maxError), DurationMS: durationMS(r.Duration), LatBucket: latencyBucket(durationMS(r.Duration)),
		Response: printable([]byte(r.Response), MaxExcerpt), TraceID: r.TraceID, Redelivery: r.Redelivery, Replica: r.Replica, Unit: r.Unit,
		Epoch: r.Epoch, ClusterTime: r.ClusterTime,
	}
	if s.Replica == "" {
		s.Replica = replica
	}
	switch {
	case r.BatchKeys != nil:
		s.Keys = r.BatchKeys
	case r.DocumentKey != nil:
		s.Keys = []bson.Raw{r.DocumentKey}
	}
	return s
}

// record returns the Record a document holds.
func (s *stored) record() Record {
	r := Record{
		Source: s.Source, DB: s.DB, Coll: s.Coll, Operation: s.Operation, Sink: s.Sink, Rules: s.Rules,
		Attempt: s.Attempt, Outcome: s.Outcome, Status: s.Status, Code: s.Code, ErrorClass: s.ErrorClass, Error: s.Error,
		Duration: time.Duration(s.DurationMS * float64(time.Millisecond)), Response: s.Response, TraceID: s.TraceID, Redelivery: s.Redelivery,
		Replica: s.Replica, Unit: s.Unit, Epoch: s.Epoch, ClusterTime: s.ClusterTime, Time: s.At.UTC(),
	}
	if len(s.EventIDs) > 0 {
		r.EventID = s.EventIDs[0]
	}
	if len(s.EventIDs) > 1 {
		r.BatchIDs = s.EventIDs
		r.BatchKeys = s.Keys
	}
	if len(s.Keys) > 0 {
		r.DocumentKey = s.Keys[0]
	}
	return r
}

package deliverylog

import (
	"encoding/json"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// recordJSON is a Record as the API and the CLI print it.
type recordJSON struct {
	EventIDs    []string          `json:"event_ids"`
	Source      string            `json:"source"`
	DB          string            `json:"db,omitempty"`
	Coll        string            `json:"coll,omitempty"`
	Operation   string            `json:"operation,omitempty"`
	Keys        []json.RawMessage `json:"document_keys,omitempty"`
	Sink        string            `json:"sink"`
	Rules       []string          `json:"rules,omitempty"`
	Attempt     int               `json:"attempt"`
	Outcome     Outcome           `json:"outcome"`
	Status      int               `json:"status,omitempty"`
	Code        string            `json:"code,omitempty"`
	ErrorClass  string            `json:"error_class,omitempty"`
	Error       string            `json:"error,omitempty"`
	DurationMS  float64           `json:"duration_ms"`
	Response    string            `json:"response,omitempty"`
	TraceID     string            `json:"trace_id,omitempty"`
	Redelivery  string            `json:"redelivery,omitempty"`
	Replica     string            `json:"replica,omitempty"`
	Unit        string            `json:"unit,omitempty"`
	ClusterTime *time.Time        `json:"cluster_time,omitempty"`
	At          time.Time         `json:"at"`
}

// MarshalJSON writes r with snake_case names, its document keys as
// relaxed Extended JSON and its cluster time as a UTC time.
func (r Record) MarshalJSON() ([]byte, error) {
	j := recordJSON{EventIDs: r.IDs(), Source: r.Source, DB: r.DB, Coll: r.Coll, Operation: r.Operation, Sink: r.Sink, Rules: r.Rules,
		Attempt: r.Attempt, Outcome: r.Outcome, Status: r.Status, Code: r.Code, ErrorClass: r.ErrorClass, Error: r.Error,
		DurationMS: durationMS(r.Duration), Response: r.Response, TraceID: r.TraceID, Redelivery: r.Redelivery,
		Replica: r.Replica, Unit: r.Unit, At: r.Time.UTC()}
	keys := r.BatchKeys
	if keys == nil && r.DocumentKey != nil {
		keys = []bson.Raw{r.DocumentKey}
	}
	for _, k := range keys {
		b, err := bson.MarshalExtJSON(k, false, false)
		if err != nil {
			b = []byte("null")
		}
		j.Keys = append(j.Keys, b)
	}
	if !r.ClusterTime.IsZero() {
		t := time.Unix(int64(r.ClusterTime.T), 0).UTC()
		j.ClusterTime = &t
	}
	return json.Marshal(j)
}

package api

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
)

// DeadLetterQuery is a dead-letter selection as an operator writes it, on the
// command line (flags), in the admin API or the console (query parameters).
// All turn it into a deadletter.Filter with Filter, so they select
// identically.
type DeadLetterQuery struct {
	Sink, Source string
	Kind         string // failed, parked, gap or empty
	Since        string // RFC 3339 time, or a duration meaning that long ago
	DocumentKey  string // the document key as (Extended) JSON, e.g. {"_id": 42}
	// DocumentKeyBSON is the key's raw BSON, base64 (the documentKeyBSON
	// of a listed entry): an exact look-up for a key its JSON cannot name
	// (invalid UTF-8, "$" field names). Exclusive with DocumentKey.
	DocumentKeyBSON string
	Limit           string // a non-negative integer; empty: the default limit
	After           string // paging: the id of the last entry of the previous page
}

// DeadLetterQueryOf returns the selection of r's query parameters (sink,
// source, kind, since, document_key, document_key_bson, limit, after).
func DeadLetterQueryOf(r *http.Request) DeadLetterQuery {
	v := r.URL.Query()
	return DeadLetterQuery{
		Sink: v.Get("sink"), Source: v.Get("source"), Kind: v.Get("kind"), Since: v.Get("since"),
		DocumentKey: v.Get("document_key"), DocumentKeyBSON: v.Get("document_key_bson"), Limit: v.Get("limit"), After: v.Get("after"),
	}
}

// ListFilter is Filter for a listing: limit defaults to DefaultListLimit and
// must be from 1 to MaxListLimit (0, "no limit", is refused: a listing is
// paged).
func (q DeadLetterQuery) ListFilter(now time.Time) (deadletter.Filter, error) {
	f, err := q.Filter(now, DefaultListLimit)
	if err != nil {
		return f, err
	}
	if f.Limit < 1 || f.Limit > MaxListLimit {
		return f, fmt.Errorf("limit: %q is out of range: a listing takes 1 to %d entries (page with after)", q.Limit, MaxListLimit)
	}
	return f, nil
}

// Filter validates q and returns the deadletter filter it means. defLimit
// applies when q.Limit is empty.
func (q DeadLetterQuery) Filter(now time.Time, defLimit int) (deadletter.Filter, error) {
	f := deadletter.Filter{Sink: q.Sink, Source: q.Source, Kind: deadletter.Kind(q.Kind), AfterID: q.After, Limit: defLimit}
	if q.Kind != "" && !f.Kind.Valid() {
		return f, fmt.Errorf("kind: %q is not one of failed, parked, gap", q.Kind)
	}
	if q.Since != "" {
		if d, err := time.ParseDuration(q.Since); err == nil {
			f.Since = now.Add(-d)
		} else if t, err := time.Parse(time.RFC3339, q.Since); err == nil {
			f.Since = t
		} else {
			return f, fmt.Errorf("since: %q is neither an RFC 3339 time nor a duration such as 24h", q.Since)
		}
	}
	if q.DocumentKey != "" {
		var key bson.Raw
		if err := bson.UnmarshalExtJSON([]byte(q.DocumentKey), false, &key); err != nil {
			return f, fmt.Errorf("document key: %q is not a JSON document: %v", q.DocumentKey, err)
		}
		if err := deadletter.CheckDocumentKey(key); err != nil {
			return f, fmt.Errorf("document key: %q: %w", q.DocumentKey, err)
		}
		f.DocumentKey = key
	}
	if q.DocumentKeyBSON != "" {
		if q.DocumentKey != "" {
			return f, fmt.Errorf("document key: give document_key or document_key_bson, not both")
		}
		raw, err := base64.StdEncoding.DecodeString(q.DocumentKeyBSON)
		if err == nil {
			err = bson.Raw(raw).Validate()
		}
		if err != nil {
			return f, fmt.Errorf("document key bson: %q is not the base64 of a BSON document (copy documentKeyBSON from a listing)", q.DocumentKeyBSON)
		}
		if err := deadletter.CheckDocumentKey(raw); err != nil {
			return f, fmt.Errorf("document key bson: %w", err)
		}
		f.ExactDocumentKey = raw
	}
	if q.Limit != "" {
		n, err := strconv.Atoi(q.Limit)
		if err != nil || n < 0 {
			return f, fmt.Errorf("limit: %q is not a non-negative integer", q.Limit)
		}
		f.Limit = n
	}
	return f, nil
}

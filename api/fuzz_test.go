package api

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/test/testutil"
)

// FuzzDeadLetterQueryParams feeds arbitrary query strings of the admin API
// (GET and DELETE /api/v1/deadletters, POST .../replay) through the
// parameter parsing the handlers use. It must never panic, and whatever it
// accepts must be safe to hand to MongoDB: a listing's limit is 1 to
// MaxListLimit, a kind is valid, and a document key holds no query
// operator, at any depth.
func FuzzDeadLetterQueryParams(f *testing.F) {
	for _, seed := range []string{
		"",
		"sink=hook&source=items&kind=failed&since=24h&limit=10&after=x",
		"document_key=" + url.QueryEscape(`{"_id": 42}`),
		"document_key=" + url.QueryEscape(`{"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}}`),
		"document_key=" + url.QueryEscape(`{"_id": {"$ne": null}}`),
		"document_key=" + url.QueryEscape(`{"_id": [{"$regex": "."}]}`),
		"document_key=" + url.QueryEscape(`{"a": {"b": {"$where": "1"}}}`),
		"limit=0", "limit=1001", "limit=-1", "limit=99999999999999999999", "kind=weird",
		"since=2026-01-02T03:04:05Z", "since=-5h", "since=%zz", "document_key=%7B", "a=1&a=2&limit=1&limit=2",
		// document_key_bson (issue 24): a key JSON cannot name, an operator,
		// both key forms, not base64, not BSON.
		"sink=crm&document_key_bson=" + url.QueryEscape(testutil.KeyBSON(bson.D{{Key: "_id", Value: "\xff-not-utf8"}})),
		"document_key_bson=" + url.QueryEscape(testutil.KeyBSON(bson.D{{Key: "_id", Value: bson.D{{Key: "$ne", Value: nil}}}})),
		"document_key=%7B%7D&document_key_bson=" + url.QueryEscape(testutil.KeyBSON(bson.D{{Key: "_id", Value: 1}})),
		"document_key_bson=!!!", "document_key_bson=AAAA",
	} {
		f.Add(seed)
	}
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw string) {
		r := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/api/v1/deadletters", RawQuery: raw}}
		q := DeadLetterQueryOf(r)
		if lf, err := q.ListFilter(now); err == nil {
			if lf.Limit < 1 || lf.Limit > MaxListLimit {
				t.Fatalf("listing limit %d accepted from %q", lf.Limit, raw)
			}
			testutil.CheckDeadLetterFilter(t, raw, lf)
		}
		if ff, err := q.Filter(now, 0); err == nil {
			if ff.Limit < 0 {
				t.Fatalf("negative limit %d accepted from %q", ff.Limit, raw)
			}
			testutil.CheckDeadLetterFilter(t, raw, ff)
		}
	})
}

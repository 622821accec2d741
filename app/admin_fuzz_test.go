package app

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/changegate/changegate/deadletter"
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
	} {
		f.Add(seed)
	}
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw string) {
		r := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/api/v1/deadletters", RawQuery: raw}}
		q := queryOf(r)
		if lf, err := q.ListFilter(now); err == nil {
			if lf.Limit < 1 || lf.Limit > MaxListLimit {
				t.Fatalf("listing limit %d accepted from %q", lf.Limit, raw)
			}
			checkFuzzedFilter(t, raw, lf)
		}
		if ff, err := q.Filter(now, 0); err == nil {
			if ff.Limit < 0 {
				t.Fatalf("negative limit %d accepted from %q", ff.Limit, raw)
			}
			checkFuzzedFilter(t, raw, ff)
		}
	})
}

func checkFuzzedFilter(t *testing.T, raw string, f deadletter.Filter) {
	t.Helper()
	if f.Kind != "" && !f.Kind.Valid() {
		t.Fatalf("kind %q accepted from %q", f.Kind, raw)
	}
	if f.DocumentKey != nil {
		if err := f.DocumentKey.Validate(); err != nil {
			t.Fatalf("invalid document key accepted from %q: %v", raw, err)
		}
		if err := deadletter.CheckDocumentKey(f.DocumentKey); err != nil {
			t.Fatalf("operator in document key accepted from %q: %v", raw, err)
		}
	}
}

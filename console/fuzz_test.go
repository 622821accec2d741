package console

import (
	"encoding/json"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/test/testutil"
)

// FuzzConsoleActionBody feeds arbitrary JSON bodies of the console's bulk
// actions (POST /ui/api/replay, DELETE /ui/api/deadletters) through
// selection. It must never panic; what it accepts is safe to hand to
// MongoDB (as FuzzDeadLetterQueryParams), and a selection of everything is
// flagged unless it says "all": true.
func FuzzConsoleActionBody(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"all":true}`, `{"ids":["a/hook"]}`, `{"ids":[]}`, `{"sink":"crm"}`,
		`{"sink":"crm","document_key_bson":"` + testutil.KeyBSON(bson.D{{Key: "_id", Value: "\xff"}}) + `","until":"2026-11-26T14:00:00.001Z"}`,
		`{"document_key_bson":"` + testutil.KeyBSON(bson.D{{Key: "_id", Value: bson.D{{Key: "$gt", Value: 1}}}}) + `"}`,
		`{"document_key":"{\"_id\":{\"$ne\":1}}"}`, `{"until":"yesterday"}`, `{"until":"2026-11-26T14:00:00Z"}`,
		`{"since":"24h","kind":"failed"}`, `{"kind":"weird"}`, `{"sinks":"x"}`, `[1]`, `null`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sel, refuse, err := selection(b)
		if err != nil {
			return
		}
		testutil.CheckDeadLetterFilter(t, string(b), sel)
		if sel.Limit != 0 || sel.AfterID != "" {
			t.Fatalf("a bulk action pages (limit %d, after %q) from %s", sel.Limit, sel.AfterID, b)
		}
		everything := sel.IDs == nil && sel.Sink == "" && sel.Source == "" && sel.Kind == "" && sel.Since.IsZero() &&
			sel.DocumentKey == nil && sel.ExactDocumentKey == nil
		var body struct{ All bool }
		_ = json.Unmarshal(b, &body)
		if everything && !body.All && !refuse {
			t.Fatalf("a selection of everything is not flagged: %s", b)
		}
	})
}

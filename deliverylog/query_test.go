package deliverylog_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/deliverylog"
)

func TestQueryFilter(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	f, err := deliverylog.Query{Sink: "billing", Rule: "paid", Source: "orders", Status: "retrying", Since: "1h", Until: "2026-11-28T11:30:00Z",
		DocumentKey: `{"_id": 42}`, MinAttempts: "3", MinDuration: "500ms", Limit: "20", Cursor: "c"}.Filter(now)
	if err != nil {
		t.Fatal(err)
	}
	if f.Sink != "billing" || f.Rule != "paid" || f.Source != "orders" || f.Status != deliverylog.StatusRetrying || !f.Since.Equal(now.Add(-time.Hour)) ||
		!f.Until.Equal(now.Add(-30*time.Minute)) || f.DocumentKey.String() != `{"_id": {"$numberInt":"42"}}` || f.MinAttempts != 3 ||
		f.MinDuration != 500*time.Millisecond || f.Limit != 20 || f.Cursor != "c" {
		t.Errorf("filter = %+v", f)
	}
	for _, c := range []struct {
		q    deliverylog.Query
		want string
	}{
		{deliverylog.Query{Status: "lost"}, "status"},
		{deliverylog.Query{Since: "yesterday"}, "since"},
		{deliverylog.Query{Until: "soon"}, "until"},
		{deliverylog.Query{DocumentKey: `{"_id": {"$ne": 1}}`}, "query operator"},
		{deliverylog.Query{MinAttempts: "-1"}, "min_attempts"},
		{deliverylog.Query{MinDuration: "slow"}, "min_duration"},
		{deliverylog.Query{Limit: "1001"}, "limit"},
	} {
		_, err := c.q.Filter(now)
		if !errors.Is(err, deliverylog.ErrBadFilter) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error about %s", c.q, err, c.want)
		}
	}
}

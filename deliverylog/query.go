package deliverylog

import (
	"fmt"
	"strconv"
	"time"
)

// Query is a List filter as the admin API's query parameters and the
// command line's flags give it: strings, validated by Filter.
type Query struct {
	Sink, Rule, Source string
	// Status is one of Statuses.
	Status string
	// Since and Until are RFC 3339 times or durations (that long ago).
	Since, Until string
	// DocumentKey is the key as (Extended) JSON (ParseDocumentKey).
	DocumentKey string
	// MinAttempts is an integer, MinDuration a duration ("500ms").
	MinAttempts, MinDuration string
	// Limit is the page size, Cursor a page's Next.
	Limit, Cursor string
}

// Filter validates q and returns the Filter it means; now anchors the
// durations of Since and Until. Errors wrap ErrBadFilter and name the
// parameter.
func (q Query) Filter(now time.Time) (Filter, error) {
	f := Filter{Sink: q.Sink, Rule: q.Rule, Source: q.Source, Status: Status(q.Status), Cursor: q.Cursor}
	if q.Status != "" {
		known := false
		for _, s := range Statuses {
			known = known || s == f.Status
		}
		if !known {
			return f, fmt.Errorf("%w: status: %q is not one of failed, retrying, parked, dead_lettered, delivered", ErrBadFilter, q.Status)
		}
	}
	var err error
	if f.Since, err = when("since", q.Since, now); err != nil {
		return f, err
	}
	if f.Until, err = when("until", q.Until, now); err != nil {
		return f, err
	}
	if q.DocumentKey != "" {
		if f.DocumentKey, err = ParseDocumentKey(q.DocumentKey); err != nil {
			return f, err
		}
	}
	if q.MinAttempts != "" {
		n, err := strconv.Atoi(q.MinAttempts)
		if err != nil || n < 0 {
			return f, fmt.Errorf("%w: min_attempts: %q is not a whole number of attempts", ErrBadFilter, q.MinAttempts)
		}
		f.MinAttempts = n
	}
	if q.MinDuration != "" {
		d, err := time.ParseDuration(q.MinDuration)
		if err != nil || d < 0 {
			return f, fmt.Errorf("%w: min_duration: %q is not a duration such as 500ms", ErrBadFilter, q.MinDuration)
		}
		f.MinDuration = d
	}
	if q.Limit != "" {
		n, err := strconv.Atoi(q.Limit)
		if err != nil || n < 1 || n > MaxLimit {
			return f, fmt.Errorf("%w: limit: %q is not 1 to %d", ErrBadFilter, q.Limit, MaxLimit)
		}
		f.Limit = n
	}
	return f, nil
}

// when reads a time parameter: RFC 3339, or a duration meaning that long
// before now.
func when(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%w: %s: %q is neither an RFC 3339 time nor a duration such as 24h", ErrBadFilter, name, s)
}

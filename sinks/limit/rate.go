package limit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseRate parses a rate_limit value: a count of requests, "/", and a
// period, which is "s", "m" or "h" (one second, minute, hour) or a Go
// duration such as "100ms" or "10s". Examples: "500/s", "30000/m",
// "10/100ms". The count must be a whole number of at least 1 and the
// period positive. It returns requests per second; an error message
// quotes s and is meant to follow a key name.
func ParseRate(s string) (perSecond float64, err error) {
	countText, periodText, ok := strings.Cut(strings.TrimSpace(s), "/")
	countText, periodText = strings.TrimSpace(countText), strings.TrimSpace(periodText)
	if !ok || countText == "" || periodText == "" {
		return 0, fmt.Errorf(`%q is not a rate like "500/s"`, s)
	}
	n, err := strconv.ParseInt(countText, 10, 64)
	if err != nil {
		if _, ferr := strconv.ParseFloat(countText, 64); ferr == nil {
			return 0, fmt.Errorf(`%q: the count must be a whole number (write "1/2s" rather than "0.5/s")`, s)
		}
		return 0, fmt.Errorf(`%q is not a rate like "500/s"`, s)
	}
	if n < 1 {
		return 0, fmt.Errorf("%q: the count must be at least 1", s)
	}
	var period time.Duration
	switch periodText {
	case "s":
		period = time.Second
	case "m":
		period = time.Minute
	case "h":
		period = time.Hour
	default:
		if period, err = time.ParseDuration(periodText); err != nil {
			return 0, fmt.Errorf(`%q is not a rate like "500/s" (the period is s, m, h or a duration like "100ms")`, s)
		}
		if period <= 0 {
			return 0, fmt.Errorf("%q: the period must be positive", s)
		}
	}
	return float64(n) / period.Seconds(), nil
}

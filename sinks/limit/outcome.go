package limit

import (
	"errors"

	"github.com/changegate/changegate/sinks"
)

// OutcomeOf maps the result of a sink's Send to an Outcome: nil is
// Success; a retryable failure (transport error, timeout, 408, 429, 5xx,
// throttled entries) is Backpressure with its Retry-After; a permanent one
// (another 4xx, a malformed entry) is Rejected; context cancellation is
// Abandoned. A *BatchError is Backpressure if any entry failed retryably,
// else Rejected, and carries the longest Retry-After of its entries.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return Outcome{Class: Success}
	}
	var be *sinks.BatchError
	if errors.As(err, &be) {
		o := Outcome{Class: Rejected}
		for _, e := range be.Failed {
			eo := OutcomeOf(e)
			if eo.Class == Backpressure {
				o.Class = Backpressure
			}
			o.RetryAfter = max(o.RetryAfter, eo.RetryAfter)
		}
		return o
	}
	de, ok := sinks.Classify(err)
	switch {
	case !ok:
		return Outcome{Class: Abandoned}
	case de.Permanent:
		return Outcome{Class: Rejected}
	default:
		return Outcome{Class: Backpressure, RetryAfter: de.RetryAfter}
	}
}

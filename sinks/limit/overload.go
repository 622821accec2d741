package limit

import "time"

// Overload is a sign of an overloaded receiver outside a request's outcome
// (sinks.OverloadNotifier: a connection attempt refused, reset or slow to
// be set up, seen at sent): the adaptive limit reacts as to back-pressure
// on a request sent then — at most one decrease per window, none for a
// sign older than the last decrease, and the limit that drew it is held
// below for a while — without counting towards the circuit breaker, since
// the request itself may well succeed.
func (l *Limiter) Overload(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onBackpressure(l.clock.Now(), sent)
}

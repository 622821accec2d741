package sinks

import "time"

// OverloadNotifier is a Sink that sees signs of an overloaded receiver
// that the outcome of a Send does not show: a connection attempt refused
// or reset, which the sink retried within the request (that may then
// succeed), or a connection set-up slowed by a receiver whose accept queue
// is full (Linux drops the attempt and the client's TCP retries it after
// 1 s, 3 s, 7 s...). The lane's limiter stage registers notify, which the
// sink calls with when the attempt that showed it started; it must be
// quick and safe for concurrent use. NotifyOverload is called before the
// first Send.
type OverloadNotifier interface {
	NotifyOverload(notify func(at time.Time))
}

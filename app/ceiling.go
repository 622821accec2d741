package app

import "github.com/changegate/changegate/config"

// legacyCeiling is the adaptive limit's ceiling of releases before it
// adapted (max_in_flight_max = 1024): never less than this when
// max_in_flight_max is not set.
const legacyCeiling = 1024

// adaptiveCeiling returns the most requests sink sc may have in flight with
// max_in_flight = "auto": max_in_flight_max when the user set it (an
// explicit cap), else the sources' max_in_flight_events — a request holds at
// least one event, so more could never be in flight, and what those events
// hold is bounded by max_in_flight_bytes, not by a count of requests —
// within this sink's share of the open-file limit: each request in flight
// is an HTTP/1.1 connection (a file descriptor, two goroutines of the HTTP
// client and a worker, ~30–40 KiB), and half of nofile is shared among the
// auto sinks (the other half: MongoDB connections, the admin server, logs).
// Never below 1024, the fixed default of earlier releases. 0 for a fixed
// max_in_flight.
func adaptiveCeiling(cfg *config.Config, sc config.Sink) int {
	if sc.MaxInFlight > 0 {
		return 0
	}
	if sc.MaxInFlightMax > 0 {
		return sc.MaxInFlightMax
	}
	return ceilingFor(maxInFlightEvents(cfg), openFileLimit(), autoSinks(cfg))
}

// ceilingFor is adaptiveCeiling's default for a process whose sources hold
// at most events in flight, with nofile open files (0: unknown) shared by
// sinks adaptive sinks.
func ceilingFor(events, nofile, sinks int) int {
	c := events
	if c <= 0 {
		c = config.DefaultMaxInFlightEvents
	}
	if nofile > 0 {
		c = min(c, nofile/2/max(sinks, 1))
	}
	return max(c, legacyCeiling)
}

// autoSinks counts the sinks of cfg with max_in_flight = "auto" and no
// max_in_flight_max of their own: those that share the open files.
func autoSinks(cfg *config.Config) int {
	n := 0
	for _, s := range cfg.Sinks {
		if s.MaxInFlight == 0 && s.MaxInFlightMax == 0 {
			n++
		}
	}
	return n
}

// Package checkpoint owns a source's position in its change stream: the
// Tracker turns acknowledgements that arrive in any order into the highest
// contiguous position below which every event was handled (and caps the
// events in flight, which is the source's backpressure), and the Store
// persists that position in MongoDB so the next start resumes after it.
package checkpoint

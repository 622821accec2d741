// Package sinks defines the Sink interface every destination implements, the
// error values that tell the delivery engine whether to retry, and the retry
// policy shared by all sinks.
package sinks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/changegate/changegate/event"
)

// Sink delivers batches of events to one destination.
//
// Send is called by the delivery engine with 1..MaxBatch() events; it may be
// called concurrently from several workers. It returns nil when every event
// was accepted, a *BatchError when only some entries failed, or another error
// (ideally an *Error) when the whole batch failed. Send must not retry on its
// own beyond transport-level retries of a single request: retry and backoff
// are the engine's job. Close releases resources; no Send follows it.
type Sink interface {
	Name() string
	MaxBatch() int
	Send(ctx context.Context, batch []*event.Event) error
	Close() error
}

// Error is a delivery failure with the retry decision as data.
type Error struct {
	Err error
	// Permanent is true when retrying cannot help (a 4xx other than
	// 408/429, an entry the destination rejects as malformed, an event too
	// large to send). Permanent failures go to the dead-letter collection.
	Permanent bool
	// RetryAfter is the destination's requested wait (Retry-After), if any.
	RetryAfter time.Duration
	// Reason is a short machine-friendly cause used as a metric label and in
	// dead letters, e.g. "http_503", "transport", "oversize", "throttled".
	Reason string
	// Status is the HTTP status of the receiver's answer (0: none, or
	// not known), Code the error code of an AWS or Kafka answer ("":
	// none), and Answer a printable excerpt of the receiver's answer (at
	// most MaxAnswer bytes; "": none). They are what the delivery's
	// observers record of the failure (package observe); Err's text may
	// quote them too.
	Status int
	Code   string
	Answer string
}

// MaxAnswer is the most bytes of a receiver's answer an Error keeps
// (Answer).
const MaxAnswer = 1 << 10

// Answer returns an excerpt of a receiver's answer for Error.Answer:
// printable (see Printable), trimmed, at most MaxAnswer bytes (a cut on a
// rune boundary, marked with "...").
func Answer(b []byte) string {
	s := strings.TrimSpace(Printable(string(b[:min(len(b), MaxAnswer+utf8.UTFMax)])))
	if len(s) <= MaxAnswer {
		return s
	}
	n := MaxAnswer - len("...")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// Error returns the failure's text, made printable (see Printable): the
// text may quote what a receiver said (an HTTP reason phrase, a body, an
// entry's error message), and it ends up in logs, dead letters, the admin
// API, the console and the CLI's terminal output.
func (e *Error) Error() string { return Printable(e.Err.Error()) }

// Printable returns s with every control character (C0 but for none, DEL
// and C1, such as ESC, BEL and CSI, which a terminal would execute)
// replaced by a space, and invalid UTF-8 by U+FFFD. s itself is returned
// when it has nothing to replace.
func Printable(s string) string {
	clean := utf8.ValidString(s)
	for i := 0; clean && i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == 0x7f || (c == 0xc2 && i+1 < len(s) && s[i+1] >= 0x80 && s[i+1] <= 0x9f) {
			clean = false
		}
	}
	if clean {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}
func (e *Error) Unwrap() error { return e.Err }

// Permanent wraps err as a permanent delivery failure.
func Permanent(reason string, err error) *Error {
	return &Error{Err: err, Permanent: true, Reason: reason}
}

// Retryable wraps err as a retryable delivery failure.
func Retryable(reason string, retryAfter time.Duration, err error) *Error {
	return &Error{Err: err, RetryAfter: retryAfter, Reason: reason}
}

// Classify returns err as an *Error; errors that are not *Error count as
// retryable transport failures, except context cancellation which is returned
// as is with ok false.
func Classify(err error) (de *Error, ok bool) {
	if err == nil {
		return nil, false
	}
	if errors.Is(err, context.Canceled) {
		return nil, false
	}
	if errors.As(err, &de) {
		return de, true
	}
	return &Error{Err: err, Reason: "error"}, true
}

// BatchError reports a batch in which only some entries failed. Failed maps
// the index of each failed entry in the batch to its error; entries not in
// the map were delivered.
type BatchError struct {
	Failed map[int]error
}

func (b *BatchError) Error() string {
	for i, err := range b.Failed {
		return fmt.Sprintf("%d of the batch's entries failed (entry %d: %v)", len(b.Failed), i, err)
	}
	return "batch failed"
}

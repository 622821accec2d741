// Package confcheck collects the configuration errors a sink's New finds, so
// that they are reported together, under the sink's kind and name, in one
// error ("sqs orders: queue_url or queue_name is required\ntimeout ...").
package confcheck

import (
	"errors"
	"fmt"
)

// Errors is the list of configuration errors of one sink.
type Errors struct {
	prefix string
	errs   []error
}

// New returns an empty list for a sink of kind ("webhook", "sqs", ...)
// named name (may be empty).
func New(kind, name string) *Errors {
	prefix := kind
	if name != "" {
		prefix += " " + name
	}
	return &Errors{prefix: prefix}
}

// Prefix is the sink's kind, then its name when it has one: "sqs orders".
func (e *Errors) Prefix() string { return e.prefix }

// Addf adds an error formatted as by fmt.Errorf.
func (e *Errors) Addf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Errorf(format, args...))
}

// Add adds err unless it is nil.
func (e *Errors) Add(err error) {
	if err != nil {
		e.errs = append(e.errs, err)
	}
}

// Err returns nil when no error was added, else all of them joined
// (errors.Join) and wrapped under the prefix.
func (e *Errors) Err() error {
	if len(e.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w", e.prefix, errors.Join(e.errs...))
}

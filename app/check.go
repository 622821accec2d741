package app

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/changegate/changegate/config"
)

// Check validates cfg as Run does before it connects: it compiles the
// rules and builds every sink exactly as Run builds it (the same
// constructors, options and validation), then closes them. It connects to
// nothing. Every problem is reported, joined; a sink's error names it as
// sinks[i] and the file.
func Check(cfg *config.Config) error {
	var errs []error
	if _, err := CompileRules(cfg); err != nil {
		errs = append(errs, err)
	}
	discard := slog.New(slog.DiscardHandler)
	for i, sc := range cfg.Sinks {
		sp, err := buildSink(cfg, sc, discard)
		if err != nil {
			errs = append(errs, fmt.Errorf("sinks[%d]: %w (in %s)", i, err, cfg.File))
			continue
		}
		_ = sp.Sink.Close()
	}
	return errors.Join(errs...)
}

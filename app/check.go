package app

import (
	"errors"
	"fmt"
	"log/slog"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/query"
)

// Check validates cfg as Run does before it connects: it compiles the
// rules and builds every sink exactly as Run builds it (the same
// constructors, options and validation), then closes them. It connects to
// nothing. Every problem is reported, joined; a sink's error names it as
// sinks[i] and the file.
func Check(cfg *config.Config) error {
	var errs []error
	if _, err := MemorySizing(cfg); err != nil {
		errs = append(errs, err)
	}
	if _, err := CompileRules(cfg); err != nil {
		errs = append(errs, err)
	}
	discard := slog.New(slog.DiscardHandler)
	for i, sc := range cfg.Sinks {
		sp, err := buildSink(cfg, sc, discard, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("sinks[%d]: %w (in %s)", i, err, cfg.File))
			continue
		}
		_ = sp.Sink.Close()
	}
	return errors.Join(errs...)
}

// PushdownNotes explains, one line per rule, which rule filters are
// evaluated in changegate only instead of being pushed down into the change
// stream, and why (query.BacktrackRisk: MongoDB's regex engine could take
// exponential time on them). check prints them; they are not errors.
func PushdownNotes(cfg *config.Config) []string {
	var out []string
	for i, r := range cfg.Rules {
		if len(r.Filter) == 0 {
			continue
		}
		raw, err := bson.Marshal(r.Filter)
		if err != nil {
			continue
		}
		if why := query.BacktrackRisk(raw); why != "" {
			out = append(out, fmt.Sprintf("rules[%d] (%s): filter evaluated in changegate only, not pushed down to MongoDB: %s", i, r.Name, why))
		}
	}
	return out
}

// StateDatabaseNotes says, one line per cluster-level source, that
// changegate's own state database (mongo.state_database) is left out of
// its stream, snapshot and backfills: its checkpoint saves and dead
// letters would otherwise be events (a database-level source of it is
// refused by the configuration); and, per source of one collection of the
// state database, what watching it on purpose implies. check prints them;
// they are not errors.
func StateDatabaseNotes(cfg *config.Config) []string {
	var out []string
	for i, sc := range cfg.Sources {
		switch {
		case sc.Database == "":
			out = append(out, fmt.Sprintf("sources[%d] (%s) watches the whole cluster except changegate's state database %q (mongo.state_database): its changes are left out of the stream (a $match on ns.db), the snapshot and backfills", i, sc.Name, cfg.Mongo.StateDatabase))
		case sc.Database == cfg.Mongo.StateDatabase:
			out = append(out, fmt.Sprintf("sources[%d] (%s) watches %s.%s, a collection of changegate's own state database: its documents hold raw, unshaped changes (other sinks' redactions do not apply to them), and a delivery of this source that is dead-lettered becomes one of its events again", i, sc.Name, sc.Database, sc.Collection))
		}
	}
	return out
}

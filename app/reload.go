package app

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/router"
)

// ErrReloadRejected wraps every reason a reload was refused; the running
// configuration stays in force.
var ErrReloadRejected = errors.New("reload rejected; the running configuration stays in force")

// Reload re-reads the configuration and applies its rules and sinks in place:
// unchanged sinks keep their lanes, changed and new sinks get new ones,
// sources whose pushed-down filter changed reopen their streams after the
// last change they handed over. Checkpoints and events in flight are kept.
// Changes to [mongo], [[sources]] or server.listen need a restart and make
// the reload fail, as does an invalid file (an error wrapping
// ErrReloadRejected, one reason a line: api.Refusal).
func (g *gateway) Reload() error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	file, err := g.loadConfig()
	if err != nil {
		return fmt.Errorf("%w:\n%v", ErrReloadRejected, err)
	}
	return g.apply(file)
}

// apply runs the configuration of file, with the stored subscriptions
// added (when enabled), as Reload describes. The caller holds reloadMu.
func (g *gateway) apply(file *config.Config) error {
	next := g.subs.merge(file, g.log)
	cur := g.Config()
	var fixed []string
	if !reflect.DeepEqual(cur.Mongo, next.Mongo) {
		fixed = append(fixed, "[mongo]")
	}
	if !reflect.DeepEqual(cur.Sources, next.Sources) {
		fixed = append(fixed, "[[sources]]")
	}
	// The instance name is fixed for the life of the process (a default
	// one is random on every load).
	next.Cluster.Instance = cur.Cluster.Instance
	if !reflect.DeepEqual(cur.Cluster, next.Cluster) {
		fixed = append(fixed, "[cluster]")
	}
	if cur.Server.Listen != next.Server.Listen {
		fixed = append(fixed, "server.listen")
	}
	if cur.Subscriptions.Enabled != next.Subscriptions.Enabled || cur.Subscriptions.Key != next.Subscriptions.Key {
		fixed = append(fixed, "subscriptions.enabled or its key")
	}
	if len(fixed) > 0 {
		return fmt.Errorf("%w: %s changed, which takes a restart", ErrReloadRejected, strings.Join(fixed, ", "))
	}
	rules, err := CompileRules(next)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrReloadRejected, err)
	}
	var updates []router.LaneUpdate
	var built []router.SinkSpec
	for _, sc := range next.Sinks {
		if old := cur.Sink(sc.Name); old != nil && reflect.DeepEqual(*old, sc) {
			updates = append(updates, router.LaneUpdate{Name: sc.Name, Keep: true})
			continue
		}
		sp, err := buildSink(next, sc, g.log, g.metrics)
		if err != nil {
			for _, b := range built {
				_ = b.Sink.Close()
			}
			return fmt.Errorf("%w: %v", ErrReloadRejected, err)
		}
		built = append(built, sp)
		updates = append(updates, router.LaneUpdate{Name: sc.Name, Spec: sp})
	}
	if err := g.engine.Reload(rules, updates); err != nil {
		return fmt.Errorf("%w: %v", ErrReloadRejected, err)
	}
	g.units.mu.Lock()
	changed := map[string]bool{}
	for _, sc := range next.Sources {
		push, _ := rules.Pushdown(sc.Name)
		if g.noPushdown {
			push = nil
		}
		if !reflect.DeepEqual(push, g.units.pushdowns[sc.Name]) {
			g.units.pushdowns[sc.Name] = push
			changed[sc.Name] = true
		}
	}
	for _, u := range g.units.running {
		if changed[u.def.source] {
			u.src.SetPushdown(g.units.pushdowns[u.def.source])
		}
	}
	g.units.mu.Unlock()
	g.cfgPtr.Store(next)
	if g.subs != nil {
		g.subs.mu.Lock()
		g.subs.file = file
		g.subs.mu.Unlock()
	}
	g.log.Info("configuration reloaded", "sinks", len(next.Sinks), "rules", len(next.Rules))
	return nil
}

// Config returns the configuration in force (a reload replaces it).
func (g *gateway) Config() *config.Config { return g.cfgPtr.Load() }

// pushdowns is the $match stage each source currently runs with.
type pushdowns map[string]bson.D

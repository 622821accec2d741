package app

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/router"
)

// ErrReloadRejected wraps every reason a reload was refused; the running
// configuration stays in force.
var ErrReloadRejected = errors.New("reload rejected; the running configuration stays in force")

// reload re-reads the configuration and applies its rules and sinks in place:
// unchanged sinks keep their lanes, changed and new sinks get new ones,
// sources whose pushed-down filter changed reopen their streams after the
// last change they handed over. Checkpoints and events in flight are kept.
// Changes to [mongo], [[sources]] or server.listen need a restart and make
// the reload fail, as does an invalid file.
func (g *gateway) reload() error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	next, err := g.loadConfig()
	if err != nil {
		return fmt.Errorf("%w:\n%v", ErrReloadRejected, err)
	}
	cur := g.config()
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
	g.log.Info("configuration reloaded", "sinks", len(next.Sinks), "rules", len(next.Rules))
	return nil
}

func (g *gateway) config() *config.Config { return g.cfgPtr.Load() }

func (g *gateway) reloadHandler(w http.ResponseWriter, _ *http.Request) {
	if err := g.reload(); err != nil {
		g.log.Error("reload failed", "err", err)
		writeJSON(w, http.StatusBadRequest, reloadError{Error: ErrReloadRejected.Error(), Problems: problems(err)})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "reloaded"})
}

type reloadError struct {
	Error    string   `json:"error"`
	Problems []string `json:"problems"`
}

// problems splits a reload error into its lines, without the rejection
// preamble.
func problems(err error) []string {
	msg := strings.TrimPrefix(err.Error(), ErrReloadRejected.Error())
	msg = strings.TrimLeft(msg, ":\n ")
	var out []string
	for _, l := range strings.Split(msg, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// pushdowns is the $match stage each source currently runs with.
type pushdowns map[string]bson.D

package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
)

// Who manages an entry of the subscriptions' listing: "managed_by".
const (
	// ManagedByAPI marks a subscription stored through the API.
	ManagedByAPI = "api"
	// ManagedByConfig marks a name of the operator's configuration file
	// (a [[rules]] or [[sinks]] entry): listed read-only, changed only in
	// the file.
	ManagedByConfig = "config"
)

// configEntry is a name of the operator's file as the subscriptions'
// listing shows it, read-only: the [[rules]] entry of that name (with the
// names of its sinks) and the [[sinks]] entry of that name, whichever
// exist. A subscription is a rule and a sink of one name; the file's names
// share their namespace. Targets (URLs, queues) are not shown: a URL may
// hold a credential.
type configEntry struct {
	Name      string      `json:"name"`
	ManagedBy string      `json:"managed_by"`
	Rule      *configRule `json:"rule,omitempty"`
	Sink      *configSink `json:"sink,omitempty"`
}

type configRule struct {
	Source     string          `json:"source"`
	Operations []string        `json:"operations,omitempty"`
	Namespaces []string        `json:"namespaces,omitempty"`
	Filter     json.RawMessage `json:"filter,omitempty"`
	Envelope   string          `json:"envelope,omitempty"`
	Sinks      []string        `json:"sinks"`
}

type configSink struct {
	Type         string `json:"type"`
	BatchSize    int    `json:"batch_size"`
	Transactions string `json:"transactions,omitempty"`
	// MaxInFlight is "auto" or the fixed number.
	MaxInFlight any    `json:"max_in_flight"`
	Ordering    string `json:"ordering,omitempty"`
}

// configEntries returns the entries of cfg's rule and sink names, in name
// order, those keep says yes to.
func configEntries(cfg *config.Config, keep func(name string) bool) ([]configEntry, error) {
	byName := map[string]*configEntry{}
	entry := func(name string) *configEntry {
		e := byName[name]
		if e == nil {
			e = &configEntry{Name: name, ManagedBy: ManagedByConfig}
			byName[name] = e
		}
		return e
	}
	for _, r := range cfg.Rules {
		if !keep(r.Name) {
			continue
		}
		cr := &configRule{Source: r.Source, Operations: r.Operations, Envelope: r.Shape.Envelope, Sinks: slices.Clone(r.Sinks)}
		for _, ns := range r.Namespaces {
			cr.Namespaces = append(cr.Namespaces, ns.String())
		}
		if r.Filter != nil {
			b, err := bson.MarshalExtJSON(r.Filter, false, false)
			if err != nil {
				return nil, fmt.Errorf("rule %s: filter: %w", r.Name, err)
			}
			cr.Filter = b
		}
		entry(r.Name).Rule = cr
	}
	for _, s := range cfg.Sinks {
		if !keep(s.Name) {
			continue
		}
		cs := &configSink{Type: s.Type, BatchSize: s.BatchSize, Transactions: s.Transactions, MaxInFlight: config.MaxInFlightAuto, Ordering: string(s.Ordering)}
		if s.MaxInFlight > 0 {
			cs.MaxInFlight = s.MaxInFlight
		}
		entry(s.Name).Sink = cs
	}
	out := make([]configEntry, 0, len(byName))
	for _, e := range byName {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b configEntry) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// configEntryOf returns the file's entry named name, if the file defines
// that name.
func (s *Server) configEntryOf(name string) (configEntry, bool, error) {
	es, err := configEntries(s.subs.File(), func(n string) bool { return n == name })
	if err != nil || len(es) == 0 {
		return configEntry{}, false, err
	}
	return es[0], true, nil
}

// apiManaged serves h unless name is the configuration file's: a name of
// a [[rules]] or [[sinks]] entry is listed read-only and answers 409 to a
// change. A DELETE of a stored subscription whose name the file took later
// (it is not applied) is served: it removes the stored one only, and its
// purge leaves the entries of the file's sink of that name alone
// (subscription.Store.RunPurges).
func (s *Server) apiManaged(h func(http.ResponseWriter, *http.Request, Principal, string)) func(http.ResponseWriter, *http.Request, Principal, string) {
	return func(w http.ResponseWriter, r *http.Request, p Principal, name string) {
		if _, ok, _ := s.configEntryOf(name); ok {
			if r.Method == http.MethodDelete {
				if _, err := s.subs.Store.Get(r.Context(), name); err == nil {
					h(w, r, p, name)
					return
				}
			}
			WriteError(w, http.StatusConflict, fmt.Sprintf("%q is defined in the configuration file (a [[rules]] or [[sinks]] entry), not through the API: it is read-only here; the operator changes it in the file and reloads", name))
			return
		}
		h(w, r, p, name)
	}
}

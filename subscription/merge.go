package subscription

import (
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
)

// Skipped is a stored subscription Merge left out, and why.
type Skipped struct {
	Name   string
	Reason string
}

// Merge returns the configuration the gateway runs: cfg (the operator's
// file) with a sink and a rule for every active subscription of subs,
// decoded against cfg by the code that validated them, each sink signing
// with the subscription's signing secrets at now. A rule only matches
// changes at or after the subscription's creation cluster time (a source
// resuming from an older checkpoint does not send it older changes). The
// sink of a paused or disabled subscription is held (config.Sink.Held): its
// events are parked until it is resumed. One that cfg no longer accepts
// (its source removed from the file, its name now the file's) or whose
// secrets the sealer cannot open is left out and returned in skipped. cfg
// is not modified.
func Merge(cfg *config.Config, subs []Subscription, sealer *Sealer, now time.Time) (merged *config.Config, skipped []Skipped) {
	out := *cfg
	out.Sinks = append([]config.Sink(nil), cfg.Sinks...)
	out.Rules = append([]config.Rule(nil), cfg.Rules...)
	taken := TakenByConfig(cfg)
	for i := range subs {
		s := &subs[i]
		if taken(s.Name) {
			skipped = append(skipped, Skipped{s.Name, "its name is now a sink or rule of the configuration file"})
			continue
		}
		route, problems := config.ParseSubscriptionJSON(s.Spec, cfg)
		if problems != nil {
			msgs := make([]string, len(problems))
			for j, p := range problems {
				msgs[j] = p.String()
			}
			skipped = append(skipped, Skipped{s.Name, "the configuration no longer accepts it: " + strings.Join(msgs, "; ")})
			continue
		}
		secrets, err := s.SigningSecrets(now, sealer)
		if err != nil {
			skipped = append(skipped, Skipped{s.Name, err.Error()})
			continue
		}
		route.Sink.Webhook.Secrets = secrets
		route.Sink.Held = s.Status != StatusActive
		if !s.CreatedClusterTime.IsZero() {
			// The changes since its creation, and the documents a backfill
			// sends (snapshot events carry no cluster time).
			since := bson.D{{Key: "$or", Value: bson.A{
				bson.D{{Key: "clusterTime", Value: bson.D{{Key: "$gte", Value: s.CreatedClusterTime}}}},
				bson.D{{Key: "operationType", Value: "snapshot"}},
			}}}
			if route.Rule.Filter == nil {
				route.Rule.Filter = since
			} else {
				route.Rule.Filter = bson.D{{Key: "$and", Value: bson.A{route.Rule.Filter, since}}}
			}
		}
		out.Sinks = append(out.Sinks, route.Sink)
		out.Rules = append(out.Rules, route.Rule)
	}
	return &out, skipped
}

// String formats a Skipped for logs.
func (s Skipped) String() string { return fmt.Sprintf("%s: %s", s.Name, s.Reason) }

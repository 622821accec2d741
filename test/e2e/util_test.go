package e2e

import (
	"context"
	"encoding/json"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
)

func (e *env) stores(cfg *config.Config) (*checkpoint.Store, *deadletter.Store) {
	return app.Stores(cfg, e.client)
}

func (e *env) replay(cfg *config.Config) (deadletter.ReplayResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return app.Replay(ctx, cfg, e.client, deadletter.Filter{Kind: deadletter.KindFailed}, app.ReplayOptions{}, nil)
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func optsUpsert() options.Lister[options.UpdateOneOptions] {
	return options.UpdateOne().SetUpsert(true)
}

package config

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"time"
)

// Defaults of the [cluster] table and of partitions.
const (
	DefaultLeaseTTL         = 15 * time.Second
	DefaultLeasesCollection = "leases"
	// MinLeaseTTL is the shortest lease_ttl accepted: below it a renewal
	// round trip or a GC pause would lose leases all the time.
	MinLeaseTTL = 3 * time.Second
	// MaxPartitions bounds partitions of a source.
	MaxPartitions = 256
)

// Cluster is the [cluster] table: several replicas sharing the units of
// work (sources, or partitions of them) through leases in MongoDB.
type Cluster struct {
	// Enabled turns on leases (default false: one process owns every
	// unit and writes no lease).
	Enabled bool
	// LeaseTTL is how long a lease lasts without renewal (default 15s,
	// at least 3s).
	LeaseTTL time.Duration
	// RenewEvery is how often an owner renews its leases (default a third
	// of LeaseTTL, always less than half of it).
	RenewEvery time.Duration
	// Instance names this replica in leases, logs, status and metrics
	// (default $HOSTNAME, else a random id).
	Instance string
	// LeasesCollection is the collection of lease documents in the state
	// database (default "leases").
	LeasesCollection string
}

// cluster decodes the [cluster] table; m holds the other state
// collections, which the leases must not share.
func (d *decoder) cluster(o *obj, m Mongo) Cluster {
	c := Cluster{Enabled: o.boolean("enabled", false)}
	c.LeaseTTL, _ = o.duration("lease_ttl", DefaultLeaseTTL, MinLeaseTTL)
	renew, present := o.duration("renew_every", c.LeaseTTL/3, time.Millisecond)
	if present && !o.bad["renew_every"] && renew >= c.LeaseTTL/2 {
		d.errorf(o.keyPath("renew_every"), o.lineOf("renew_every"), "must be less than half of lease_ttl (%s), got %s", c.LeaseTTL/2, renew)
		renew = c.LeaseTTL / 3
	}
	c.RenewEvery = renew
	if s, v, ok := o.str("instance"); v != nil && ok {
		if strings.TrimSpace(s) == "" {
			d.errorf(o.keyPath("instance"), v.line, "must not be empty (omit it to use $HOSTNAME or a random id)")
		} else {
			c.Instance = s
		}
	}
	if c.Instance == "" {
		c.Instance = d.defaultInstance()
	}
	c.LeasesCollection = o.collName("leases_collection", DefaultLeasesCollection)
	if c.LeasesCollection == m.CheckpointCollection || c.LeasesCollection == m.DeadLetterCollection {
		d.errorf(o.keyPath("leases_collection"), o.lineOf("leases_collection"), "must differ from mongo.checkpoint_collection and mongo.deadletter_collection")
	}
	o.done()
	return c
}

// defaultInstance is $HOSTNAME (a pod's name in Kubernetes) or, without
// it, a random id.
func (d *decoder) defaultInstance() string {
	if h, ok := d.lookupEnv("HOSTNAME"); ok && strings.TrimSpace(h) != "" {
		return h
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "changegate-" + hex.EncodeToString(b[:])
}

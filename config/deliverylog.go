package config

import "time"

// Defaults and bounds of the [delivery_log] table.
const (
	DefaultDeliveryLogMode       = DeliveryLogFailures
	DefaultDeliveryLogRetention  = 72 * time.Hour
	DefaultDeliveryLogCollection = "deliveries"
	// MinDeliveryLogRetention is the shortest retention accepted: MongoDB
	// removes expired documents once a minute, so a shorter one would not
	// mean what it says.
	MinDeliveryLogRetention = time.Minute
	// MaxDeliveryLogRetention bounds retention: a TTL index's
	// expireAfterSeconds is a 32-bit number of seconds.
	MaxDeliveryLogRetention = (1<<31 - 1) * time.Second
)

// Values of [DeliveryLog.Mode].
const (
	// DeliveryLogFailures records every attempt that did not end in
	// success: failed attempts, retries, parks, dead letters and events
	// skipped by shaping.
	DeliveryLogFailures = "failures"
	// DeliveryLogAll records successful attempts too.
	DeliveryLogAll = "all"
	// DeliveryLogOff records nothing.
	DeliveryLogOff = "off"
)

// DeliveryLog is the [delivery_log] table: the per-attempt records of
// package deliverylog.
type DeliveryLog struct {
	// Mode is DeliveryLogFailures (default), DeliveryLogAll or
	// DeliveryLogOff.
	Mode string
	// Retention is how long a record is kept (a TTL index; default 72h,
	// at least 1m).
	Retention time.Duration
	// Collection is the collection of records in the state database
	// (default "deliveries").
	Collection string
}

// deliveryLog decodes the [delivery_log] table; m and c hold the other
// state collections, which the records must not share.
func (d *decoder) deliveryLog(o *obj, m Mongo, c Cluster) DeliveryLog {
	l := DeliveryLog{Mode: o.enum("mode", DefaultDeliveryLogMode, []string{DeliveryLogFailures, DeliveryLogAll, DeliveryLogOff})}
	l.Retention, _ = o.duration("retention", DefaultDeliveryLogRetention, MinDeliveryLogRetention)
	if l.Retention > MaxDeliveryLogRetention && !o.bad["retention"] {
		d.errorf(o.keyPath("retention"), o.lineOf("retention"), "must be at most %s, got %s", MaxDeliveryLogRetention, l.Retention)
		l.Retention = DefaultDeliveryLogRetention
	}
	l.Collection = o.collName("collection", DefaultDeliveryLogCollection)
	switch l.Collection {
	case m.CheckpointCollection, m.DeadLetterCollection, m.DeadLetterCollection + "_fences", c.LeasesCollection:
		d.errorf(o.keyPath("collection"), o.lineOf("collection"), "must differ from mongo.checkpoint_collection, mongo.deadletter_collection (and its _fences) and cluster.leases_collection")
	}
	o.done()
	return l
}

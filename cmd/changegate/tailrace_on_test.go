//go:build race

package main

// raceDetector: the race detector is on; it slows the encoding of an
// 18 MiB change event as Extended JSON about thirtyfold.
const raceDetector = true

package k3

// RaceEnabled is raceEnabled for the external tests (package k3_test).
const RaceEnabled = raceEnabled

//! The simulator reads and writes delays in the emulator's buckets (`server::Delays`,
//! `replay::Completions`, `replay::ArrivalGaps`); its copies of their bounds and names must
//! be the emulator's, or lab and model would be counted in different buckets.

#[test]
fn the_delay_buckets_are_the_emulators() {
    assert_eq!(
        sim::server::DELAY_BOUNDS_US,
        emulator::model::DELAY_BOUNDS_US
    );
    assert_eq!(
        sim::server::DELAY_NAMES,
        emulator::model::DELAY_BUCKET_NAMES
    );
}

/* progress_fixture: the gateway /status bodies the progress tests (test_progress_parse.c,
 * test_progress_reader.c) build, and the job they answer for. */
#ifndef CIRRUS_PROGRESS_FIXTURE_H
#define CIRRUS_PROGRESS_FIXTURE_H

/* The job a gateway answers for (its "job_id"): another job's answer is refused. */
#define UID "6f1c2a9e-0000-4000-8000-000000000001"

/* The "outer" object of a gateway that takes outer steps across regions. */
#define BASE "\"job_id\":\"" UID "\",\"step\":40,\"loss\":2.5,\"tokens_per_s\":10"
#define OUTER(step, sent, received)                                                          \
    "{" BASE ",\"outer\":{\"step\":" step ",\"digest\":\"00112233aabbccdd\","              \
    "\"wan_bytes_sent\":" sent ",\"wan_bytes_received\":" received                           \
    ",\"payload_bytes_sent\":900,\"digest_mismatches\":0,\"last_sync_unix_s\":1795309200.5," \
    "\"last_sync_duration_s\":0.25,\"codec\":\"q8\",\"sync_every\":100,"                   \
    "\"links\":[{\"region\":\"r2\",\"up\":true,\"last_error\":\"\"}]}}"

#endif

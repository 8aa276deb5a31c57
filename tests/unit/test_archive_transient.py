"""Which object-store errors ``journal archive --follow`` tries again (they pass) and which stop it
(they stay until someone acts), and the credentials a URL in a message may carry are not logged."""

from multisite.pipeline.archive import redact, transient


def test_network_and_server_errors_are_transient():
    for m in ["AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect",
              "AWS Error SLOW_DOWN during PutObject", "HTTP status 503", "Operation timed out",
              "AWS Error INTERNAL_FAILURE during UploadPart"]:
        assert transient(m), m


def test_missing_bucket_and_denied_access_are_permanent():
    for m in ["AWS Error NO_SUCH_BUCKET during CreateMultipartUpload operation: The specified bucket does not exist",
              "AWS Error ACCESS_DENIED during PutObject operation: Access Denied (HTTP status 403)",
              "AWS Error INVALID_ACCESS_KEY_ID during HeadObject"]:
        assert not transient(m), m


def test_credentials_in_a_url_are_removed():
    assert redact("cannot reach http://AKIA:s3cret@minio:9000/lake (refused)") == \
        "cannot reach http://minio:9000/lake (refused)"
    assert redact("s3://lake/journals/A") == "s3://lake/journals/A"


def test_a_permanent_error_is_not_taken_for_transient_by_the_words_of_its_key_or_bucket():
    # pyarrow's message quotes the key and bucket: a prefix holding "timeout" made no such bucket transient,
    # and --follow retried it for ever.
    m = ("When initiating multiple part upload for key 'timeout-drills/A/segments/00000001.msj' in bucket "
         "'lake': AWS Error NO_SUCH_BUCKET during CreateMultipartUpload operation: The specified bucket does not exist")
    assert not transient(m)
    assert transient("When getting information for key 'timeout-drills/A' in bucket 'lake': AWS Error "
                     "NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect")

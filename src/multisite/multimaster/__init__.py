"""Multi-master document replication (the Domino family, issue 12; see DESIGN.md).

Sans-IO: ``ids`` (UNIDs, OIDs, stamps), ``document`` (the version value type), ``conflicts`` (the
seed's step 9: divergence, winner, merge, conflict documents), ``wire`` (the replicator's messages),
``session`` (a replication session as the initiator runs it, and the responder's answers), and
``schedule`` (connection documents: when they fire). ``docdb`` stores documents on the engine.
"""

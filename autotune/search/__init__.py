"""What the study searches and judges by: sampling a configuration from the space
(``space``), the two references every answer is measured against (``references``: the
untuned baseline and the tuning checklist), and the objective Optuna stores
(``objective``).
"""
